"""The breast-cancer fit (5 epochs of 8 steps) on the local runtime, two checkouts side by side, runs alternating.

    python scripts/fit_pair.py BEFORE_CHECKOUT [AFTER_CHECKOUT] [--repeats N] [--service] [--json]

Each run is a fresh process importing slsml from ``<checkout>/shared``. Per run: the fit's wall time, the CPU time
of the whole process tree (the command, the cloud's server, the function processes: what a loaded machine divides
among its users) and the fit's stages (runtime start, training, the rest). ``--service``: AFTER's fits train on a
local service of AFTER's (``slsml local up``, started before the runs and ended after them; its processes' CPU time
during each fit is counted), BEFORE's each start a runtime of their own: ``fit_pair.py . --service`` compares the two
ways of one checkout. The result goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

EPOCHS, BATCH = 5, 72  # 569 samples: 8 steps an epoch
STATE_HOME = "XDG_STATE_HOME"  # where slsml finds the local service (slsml.local.service)


def one_fit() -> dict[str, float]:
    """Run the fit in this process; its figures."""
    import keras
    import psutil
    from sklearn.datasets import load_breast_cancer

    import slsml
    from slsml.client import runs
    from slsml.local import runtime

    x, y = load_breast_cancer(return_X_y=True)
    x = ((x - x.mean(0)) / x.std(0)).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((30,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1, activation="sigmoid")]
    )
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    from slsml.local import service

    me, cpu, stages = psutil.Process(), {}, {}
    up = service.status()
    served = [] if up is None else [psutil.Process(up.pid)]  # the service's processes, busy for this fit alone

    def tree() -> list[psutil.Process]:
        return [p for root in (me, *served) for p in (root, *root.children(recursive=True))]

    before = {p.pid: sum(p.cpu_times()[:2]) for p in tree() if p is not me}
    done = threading.Event()

    def sample() -> None:  # the CPU of every process of the tree, as last seen alive
        while True:
            for process in tree():
                try:
                    times = process.cpu_times()
                    cpu[process.pid] = times.user + times.system
                except psutil.Error:
                    pass
            if done.wait(0.2):
                return

    def timed(owner: object, name: str, stage: str) -> None:
        original = getattr(owner, name)

        def call(*args: object, **kwargs: object) -> object:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                stages[stage] = stages.get(stage, 0.0) + time.perf_counter() - started

        setattr(owner, name, call)

    timed(runtime.LocalRuntime, "__enter__", "start_s")
    timed(runs, "wait_for_run", "train_s")
    exit_ = runtime.LocalRuntime.__exit__

    def exited(self: runtime.LocalRuntime, *args: object) -> None:
        done.set()
        sampler.join()
        exit_(self, *args)

    runtime.LocalRuntime.__exit__ = exited  # type: ignore[method-assign]
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    history = slsml.fit(model, x, y.astype("float32"), epochs=EPOCHS, batch_size=BATCH, verbose=0)
    wall = time.perf_counter() - started
    if up is not None:  # nothing started: the service's processes were ready
        done.set()
        sampler.join()
    stages.setdefault("start_s", 0.0)
    rest = wall - stages["start_s"] - stages["train_s"]
    spent = sum(cpu.values()) - sum(before.get(pid, 0.0) for pid in cpu)
    return {"wall_s": wall, "cpu_s": spent, **stages, "rest_s": rest, "loss": history.history["loss"][-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="the checkout to compare against")
    parser.add_argument("after", type=Path, nargs="?", default=Path(__file__).resolve().parents[1])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--service", action="store_true", help="AFTER's fits train on a local service of its own")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one fit, its JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_fit()))
        return
    with tempfile.TemporaryDirectory() as states:
        environments = {}
        for side in ("before", "after"):  # each side's own state folder: a service only where --service starts one
            checkout = getattr(args, side).resolve()
            environments[side] = {
                **os.environ,
                "PYTHONPATH": str(checkout / "shared"),
                "TF_CPP_MIN_LOG_LEVEL": "3",
                STATE_HOME: str(Path(states) / side),
            }
        if args.service:
            _slsml(environments["after"], args.after, "local", "up")
        try:
            results = _runs(args, environments)
        finally:
            if args.service:
                _slsml(environments["after"], args.after, "local", "down")
    if args.json:
        print(json.dumps(results))
        return
    names = ("wall_s", "cpu_s", "start_s", "train_s", "rest_s", "loss")
    print(f"{'median':8}" + "".join(f"{name:>10}" for name in names))
    for side, runs in results.items():
        print(f"{side:8}" + "".join(f"{statistics.median(r[name] for r in runs):10.3f}" for name in names))
    for side, runs in results.items():
        print(f"{side:8} wall_s each: " + ", ".join(f"{r['wall_s']:.1f}" for r in runs))


def _runs(args: argparse.Namespace, environments: dict[str, dict[str, str]]) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for repeat in range(args.repeats):
        for side in ("before", "after"):
            checkout = getattr(args, side).resolve()
            print(f"run {repeat + 1}/{args.repeats}: {side} ({checkout})", file=sys.stderr, flush=True)
            answer = subprocess.run(
                [sys.executable, __file__, str(args.before), "--one"],
                env=environments[side],
                cwd=checkout,
                capture_output=True,
                text=True,
                check=True,
            )
            results[side].append(json.loads(answer.stdout.splitlines()[-1]))
    return results


def _slsml(environment: dict[str, str], checkout: Path, *command: str) -> None:
    """``slsml COMMAND`` of ``checkout``, its output to stderr."""
    main = "import sys; from slsml.cli.main import main; sys.exit(main())"
    subprocess.run([sys.executable, "-c", main, *command], env=environment, cwd=checkout, stdout=sys.stderr, check=True)


if __name__ == "__main__":
    main()
