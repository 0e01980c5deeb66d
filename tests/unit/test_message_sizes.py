"""A run whose messages could exceed the size slsml's functions take is refused at start, naming the options that
make them so (against moto)."""

from __future__ import annotations

import pytest

from slsml.accounting import prices
from slsml.cost import predict as costmodel
from slsml.cost.messages import LONGEST_ETAG, check_messages, largest_reduce, message_bytes
from slsml.cost.modelinfo import from_params
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.workload import run_workload
from slsml.pipeline import launch
from slsml.pipeline.envelope import parse_message
from slsml.pipeline.services import Services
from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError, MessageRejected
from slsml.spec.messages import MAX_MESSAGE_BYTES, Participant, ReduceMessage

from .test_reduce_steps import services  # noqa: F401

FOLDING = TrainingSpec(workers=1000, global_batch=64_000, quorum=0.75, staleness=8, iterations=1000)


def test_a_staleness_fold_of_a_thousand_workers_is_refused_naming_its_options() -> None:
    participants, size = largest_reduce(FOLDING)
    assert participants == 1000 + 8 * 500  # every worker, and 8 iterations' late ones beyond the floor's 500
    late = [
        Participant(worker=w % 1000, attempt=2, samples=64_000, iteration=999, etag=LONGEST_ETAG) for w in range(4000)
    ]
    largest = ReduceMessage(
        run_id="r" * 63,
        iteration=999,
        shard=0,
        attempt=2,
        participants=tuple(
            [Participant(worker=w, attempt=2, samples=64_000, etag=LONGEST_ETAG) for w in range(1000)] + late
        ),
    )
    assert len(largest.model_dump_json()) == size > MAX_MESSAGE_BYTES
    with pytest.raises(MessageRejected):  # what the reducer would do with it
        parse_message(largest.model_dump_json(), ReduceMessage, "m")
    with pytest.raises(
        BadInputError,
        match=r"5,000 participants \(1000 workers, and with staleness 8 and"
        r" deadline_floor 0\.5 up to 4,000 late updates folded in\): [\d,]+ B,"
        r" over the 131,072 B",
    ):
        check_messages(FOLDING)
    check_messages(FOLDING.model_copy(update={"staleness": 0}))  # 1000 workers alone fit
    with pytest.raises(BadInputError, match="lower the workers or staleness"):
        check_messages(FOLDING.model_copy(update={"workers": 2, "max_workers": 1000}))  # run scale's bound


def test_the_client_refuses_it_before_it_stores_anything(services: Services) -> None:  # noqa: F811
    from slsml.client import demo
    from slsml.data import datasets as data
    from slsml.training import modelio

    data.put_dataset(services.store, "digits", *demo.digits())
    model = modelio.save_model(demo.digits_cnn(seed=1))
    spec = TrainingSpec(workers=200, global_batch=1000, staleness=30, iterations=2)
    with pytest.raises(BadInputError, match=r"participants \(200 workers, and with staleness 30"):
        launch.prepare_run(services, model, "digits", spec, run_id="chatty")
    assert services.store.list_keys(keys.run_prefix("chatty")) == []


def test_the_plan_sizes_the_same_largest_reduce_message_as_the_start() -> None:
    """W=1,000, quorum 0.75, staleness 8: the plan's message check is of the worst case the start refuses (every
    worker and the largest fold), not of a reduce at the quorum's 750 workers."""
    spec = FOLDING.model_copy(update={"deadline_floor": 0.75})  # the floor at the quorum: 8 × 250 late updates
    participants, size = largest_reduce(spec)
    assert participants == 1000 + 8 * 250
    quorum_only = message_bytes(750, 64, 1)[1]
    assert quorum_only < MAX_MESSAGE_BYTES < size  # the quorum's message fits; the worst case does not
    work = run_workload(from_params(1_000_000, Parameters()), spec)
    plan = costmodel.predict(work, Parameters(), Quotas(), prices.PriceTable())
    check = next(q for q in plan.quotas if q.name == "Reduce message size")
    assert (check.value, check.ok, check.hard) == (size, False, True)
    assert "3,000 participants (1000 workers, and with staleness 8 and deadline_floor 0.75" in check.detail
    with pytest.raises(BadInputError, match=f"{size:,} B"):
        check_messages(spec)
    with pytest.raises(BadInputError, match="the largest Reduce message lists 3,000 participants"):
        costmodel.check(work, Parameters(), Quotas())


def test_a_reduce_of_a_thousand_workers_fits_with_every_update_named_by_its_etag() -> None:
    """Every worker's update at S3's longest ETag: the message is parsed back as sent (a participant's JSON leaves out
    attempt 0 and no iteration, which it reads back as those), a fifth of the limit to spare."""
    participants = [Participant(worker=w, samples=64_000, etag=LONGEST_ETAG) for w in range(999)]
    participants.append(Participant(worker=999, attempt=3, samples=64_000, iteration=998, etag=LONGEST_ETAG))
    reduce = ReduceMessage(run_id="r" * 63, iteration=999, shard=0, participants=tuple(participants))
    body = reduce.model_dump_json()
    assert '{"worker":0,"samples":64000,"etag":' in body and '"worker":999,"attempt":3,' in body
    assert parse_message(body, ReduceMessage, "m") == reduce
    assert len(body) < 0.8 * MAX_MESSAGE_BYTES
