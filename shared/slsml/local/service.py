"""The local cloud as a background service: ``slsml local up`` starts the embedded cloud and the warm
function hosts in a process of their own and returns once they are ready; every ``slsml run`` command
then works against it as against a deployed stack, and any AWS client reaches it with ``local env``'s
variables. Its state (bucket, table, runs) lives in that process: it lasts as long as the service.

It is its user's alone: its cloud answers requests signed with credentials generated as it starts
(``slsml.local.cloud``), kept in its state file, which only that user can read: the state folder is created 0700 and
everything the service writes in it 0600 (its process's umask); a folder another user owns or may write in is
refused (``slsml.local.private``). The state folder is the user's (``user_state_dir``), not a project's: every command
finds the service from any folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from slsml.local import lifecycle
from slsml.local.accelerator import checked_accelerators
from slsml.local.cloud import LocalDeployment, deployment_in_use, owner, use_deployment
from slsml.local.private import private_folder
from slsml.pipeline.services import Services
from slsml.spec.errors import NotFoundError, SlsmlError
from slsml.spec.limits import RunLimits

STATE_HOME_ENV = "XDG_STATE_HOME"  # the user's state directory (XDG); ~/.local/state where unset or relative
STATE_FILE = "service.json"
OUTPUT_FILE = "service.log"
PRIVATE_UMASK = 0o077  # what the service creates, its user alone can read: folders 0700, files 0600
READY_TIMEOUT_S = 180.0
CONCURRENCY = 1000  # per function, before its reserved concurrency and the pool bound it: runs of any shape


class ServiceState(BaseModel):
    """What ``local up`` leaves behind for the commands that follow: where the service is and what it holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pid: int
    started_at: float
    pool: int
    log_dir: str
    deployment: dict

    @property
    def endpoint(self) -> str:
        return self.deployment["endpoint"]

    def local_deployment(self) -> LocalDeployment:
        return LocalDeployment(**self.deployment)

    def shown(self) -> dict[str, Any]:
        """The state as ``local up`` and ``local status`` print it: its secret key left to ``local env``, and its
        functions' credentials to none."""
        shown = self.model_dump(mode="json")
        secret = ("secret_access_key", "identities")
        shown["deployment"] = {k: v for k, v in self.deployment.items() if k not in secret}
        return shown


def user_state_dir() -> Path:
    """Where the local service keeps its state: ``$XDG_STATE_HOME/slsml/local``, else
    ``~/.local/state/slsml/local``."""
    home = os.environ.get(STATE_HOME_ENV, "")
    root = Path(home) if os.path.isabs(home) else Path.home() / ".local" / "state"
    return root / "slsml" / "local"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _ended(pid)


def _ended(pid: int) -> bool:
    """Whether process ``pid`` ended and is left for its parent to reap (a zombie, as Linux's ``/proc`` says; where
    there is none: not known, False)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def status(state_dir: Path | None = None) -> ServiceState | None:
    """The running service's state (in ``state_dir``, by default the user's), or None. The state file is trusted
    only if its endpoint is a loopback address whose cloud answers that its owner is the file's pid, alive: a file
    that says otherwise (its service gone, its pid reused, or a file not written by the service) is removed and
    nothing acts on it."""
    state_dir = state_dir or user_state_dir()
    path = state_dir / STATE_FILE
    try:
        if not path.exists():
            return None
        text = path.read_text()
    except PermissionError:
        raise SlsmlError(
            f"{state_dir} is another user's local service, which only that user can reach: set {STATE_HOME_ENV} to"
            " a folder of your own (or unset it) and start one of your own with `slsml local up`"
        ) from None
    state = ServiceState.model_validate_json(text)
    if not _alive(state.pid) or owner(state.endpoint, state.local_deployment().credentials) != state.pid:
        path.unlink(missing_ok=True)
        return None
    return state


def up(
    state_dir: Path | None = None,
    pool: int | None = None,
    timeout_s: float = READY_TIMEOUT_S,
    limits: RunLimits | None = None,
    memory_mb: dict[str, int] | None = None,
    timeouts_s: dict[str, int] | None = None,
    accelerator_gib: dict[str, int] | None = None,
) -> ServiceState:
    """Start the service (or return the one running) once it is ready to take runs of at most ``limits``; its
    functions have the deployment's memory, timeouts and accelerators but for those ``memory_mb`` (function → MB),
    ``timeouts_s`` (function → s) and ``accelerator_gib`` (function → GiB) name."""
    state_dir = state_dir or user_state_dir()
    running = status(state_dir)
    if running is not None:
        return running
    from slsml.local.runtime import default_pool

    # refused here, in one line, rather than by the service's process as it starts
    checked_accelerators(accelerator_gib or {}, {"worker": min(CONCURRENCY, pool or default_pool())})
    private_folder(state_dir.parent)  # slsml's own state: the user's alone as well
    private_folder(state_dir)
    command = [
        sys.executable,
        "-m",
        "slsml.local.service",
        str(state_dir),
        (limits or RunLimits()).model_dump_json(),
        json.dumps(memory_mb or {}),
        json.dumps(timeouts_s or {}),
        json.dumps(accelerator_gib or {}),
        *([str(pool)] if pool else []),
    ]
    (state_dir / OUTPUT_FILE).unlink(missing_ok=True)  # an older one may be 0644
    log = os.open(state_dir / OUTPUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(log, "wb") as output:
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )  # outlives this command and its terminal's Ctrl-C
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = status(state_dir)
        if state is not None and state.pid == process.pid:
            return state
        if process.poll() is not None:
            tail = (state_dir / OUTPUT_FILE).read_text(errors="replace")[-2000:]
            raise SlsmlError(f"the local service exited ({process.returncode}) before it was ready:\n{tail}")
        time.sleep(0.2)
    process.terminate()
    raise SlsmlError(f"the local service was not ready within {timeout_s:.0f} s (see {state_dir / OUTPUT_FILE})")


def down(state_dir: Path | None = None, timeout_s: float = 60.0) -> bool:
    """Stop the service: its cloud, its functions and everything they held. False if none was up."""
    state_dir = state_dir or user_state_dir()
    state = status(state_dir)
    if state is None:
        return False
    os.kill(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(state.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(state.pid):
        os.kill(state.pid, signal.SIGKILL)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return True


def connect(state_dir: Path | None = None) -> tuple[ServiceState, Services]:
    """The running service's state, and Services that reach it (this process's AWS clients point at it)."""
    state = status(state_dir)
    if state is None:
        raise NotFoundError("no local service is up: start one with `slsml local up`, or give --stack NAME")
    deployment = state.local_deployment()
    use_deployment(deployment)
    return state, _services(deployment)


@contextmanager
def connected(state: ServiceState) -> Iterator[Services]:
    """Services that reach the running service ``state``, for the block alone: after it, this process's AWS clients
    are as they were (a Python caller's own clients reach what they reached before)."""
    deployment = state.local_deployment()
    with deployment_in_use(deployment):
        yield _services(deployment)


def _services(deployment: LocalDeployment) -> Services:
    """The clients of the service's bucket, table, topics, state machine and deadline queue, under its limits."""
    return Services.from_names(
        deployment.bucket,
        deployment.table,
        deployment.topic_arns,
        deployment.state_machine_arn,
        deployment.deadline_queue_url,
        RunLimits.model_validate_json(deployment.run_limits or "{}"),
    )


def environment(state: ServiceState) -> dict[str, str]:
    """The variables with which any AWS client (the AWS CLI, boto3) reaches the service."""
    return state.local_deployment().environment()


def serve(
    state_dir: Path,
    pool: int | None,
    limits: RunLimits,
    memory_mb: dict[str, int],
    timeouts_s: dict[str, int],
    accelerator_gib: dict[str, int],
) -> None:
    """The service's process: run the local runtime until SIGTERM or SIGINT."""
    from slsml.local.runtime import LocalRuntime

    os.umask(PRIVATE_UMASK)  # before it creates anything: its logs, its state file, its processes' files

    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log_dir = (state_dir / "logs").resolve()
    runtime = LocalRuntime(
        workers=CONCURRENCY,
        reducers=CONCURRENCY,
        pool=pool,
        log_dir=log_dir,
        limits=limits,
        memory_mb=memory_mb,
        timeouts_s=timeouts_s,
        accelerator_gib=accelerator_gib,
    )
    with runtime:
        assert runtime.deployment is not None  # provisioned as the runtime is entered
        state = ServiceState(
            pid=os.getpid(),
            started_at=time.time(),
            pool=runtime.concurrency["worker"],
            log_dir=str(log_dir),
            deployment=dataclasses.asdict(runtime.deployment),
        )
        path = state_dir / STATE_FILE
        staged = path.with_suffix(".tmp")
        staged.unlink(missing_ok=True)
        with open(os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as written:  # 0600 as created
            written.write(json.dumps(state.model_dump(), indent=1))
        staged.replace(path)  # whole, or not at all: readers never see half a file
        print(f"local service ready at {state.endpoint}", flush=True)
        applied = time.monotonic()
        while not stopping:
            time.sleep(0.5)
            if time.monotonic() - applied > lifecycle.PERIOD_S:  # the bucket's lifecycle rules, the table's TTL
                runtime.expire(time.time())
                applied = time.monotonic()
        path.unlink(missing_ok=True)
    print("local service stopped", flush=True)


if __name__ == "__main__":
    serve(
        Path(sys.argv[1]),
        int(sys.argv[6]) if len(sys.argv) > 6 else None,
        RunLimits.model_validate_json(sys.argv[2]),
        json.loads(sys.argv[3]),
        json.loads(sys.argv[4]),
        json.loads(sys.argv[5]),
    )
