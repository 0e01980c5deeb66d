"""The function host's warm processes start from libraries imported once, in a fork server, and run with
the host's environment as it is when they start, not the fork server's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from slsml.local.host import start_preloading
    from slsml.local.runtime import LocalRuntime

    def probe():
        return os.environ.get("SLSML_PROBE"), os.environ.get("SLSML_GONE"), "tensorflow" in sys.modules

    if __name__ == "__main__":
        os.environ.update(SLSML_PROBE="as the fork server started", SLSML_GONE="yes")
        start_preloading()
        os.environ["SLSML_PROBE"] = "as the host started its processes"
        del os.environ["SLSML_GONE"]
        with LocalRuntime(workers=1, reducers=1, pool=1, log_dir=Path(sys.argv[1])) as local:
            pools = local.host._pools
            print(json.dumps({function: pool.submit(probe).result() for function, pool in pools.items()}))
    """
)


def test_warm_processes_have_the_preloaded_libraries_and_the_hosts_environment(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "logs")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(seen) >= {"worker", "reducer", "merger", "reduce_launcher", "work_launcher"}
    for function, (probe, gone, tensorflow) in seen.items():
        assert probe == "as the host started its processes", function
        assert gone is None, function
        assert tensorflow, function  # the Worker's and Merger's library, imported before any handler
