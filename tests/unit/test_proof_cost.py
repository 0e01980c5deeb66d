"""The plan's count of a run's KMS requests for its proofs (``slsml.cost.proofs``) against what the steps ask KMS
(moto), each step's container fresh: the launcher's, one per worker, one per reducer, one of each other signing step,
each signing a message and checking one."""

from __future__ import annotations

from typing import Any

import pytest

from slsml.accounting import prices
from slsml.aws import cache as warm_cache
from slsml.cost.proofs import proof_cost
from slsml.pipeline.proof import RunKeys
from slsml.pipeline.services import Services
from slsml.spec import wiring
from slsml.spec.messages import WorkMessage

from .test_reduce_steps import _done, _register, services  # noqa: F401


@pytest.mark.parametrize(("workers", "reducers"), [(2, 2), (4, 2), (7, 3)])
def test_the_plan_counts_the_kms_requests_a_runs_steps_make(
    services: Services,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    workers: int,
    reducers: int,
) -> None:
    asked: list[str] = []

    def count(event_name: str, **_: Any) -> None:
        asked.append(event_name.rpartition(".")[2])

    kms = services.keys.kms
    kms.meta.events.register("before-call.kms", count)
    containers = [
        "work_launcher",
        *["worker"] * workers,
        *["reducer"] * reducers,
        *(kind for kind in wiring.SIGNERS if kind not in {"work_launcher", "worker", "reducer"}),
    ]
    run_id = f"counted-{workers}-{reducers}"
    _register(services, run_id, workers=workers, watched=False)
    launched = WorkMessage(run_id=run_id, iteration=0, worker=0, workers=workers)
    for kind in containers:
        monkeypatch.setattr(warm_cache, "_warm", None)  # a fresh container
        keys = RunKeys(services.table, kms, services.keys.sealing_key, kind)
        if kind == "work_launcher":  # the launch: the run's keys made
            launched = keys.sign(launched)
        else:
            keys.sign(_done(run_id, 0))
        assert keys.problem(launched) is None  # checked with the keys it read
    kms.meta.events.unregister("before-call.kms", count)
    cost = proof_cost(workers, reducers, prices.PriceTable())
    assert len(asked) == cost.kms_requests, asked
    assert asked.count("GenerateDataKeyPairWithoutPlaintext") == cost.key_pairs
    assert asked.count("Encrypt") == cost.vouches
    assert asked.count("Decrypt") == cost.unseals
