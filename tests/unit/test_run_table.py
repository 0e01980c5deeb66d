"""The run table as slsml.state.records defines it, on moto: runs are listed by a query of the sparse runs index."""

from __future__ import annotations

import time
from typing import Any

import boto3
import pytest
from moto import mock_aws

from slsml.spec.config import TrainingSpec
from slsml.state import orchestration, records
from slsml.state.records import META, RUN_KIND, dynamo, iteration_sk, worker_sk
from slsml.state.runtable import RunTable


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        boto3.client("dynamodb").create_table(**records.create_table_arguments("runs"))
        yield boto3.resource("dynamodb").Table("runs")


def register(table: Any, run_id: str, created_at: float, iterations: int = 3) -> None:
    """A run's META item as the state machine's RegisterRun writes it, and iteration items beside it."""
    table.put_item(
        Item=records.run_item(run_id, "d", TrainingSpec(workers=2, reducers=1, iterations=iterations), created_at)
    )
    for i in range(iterations):
        table.put_item(Item=dynamo({"pk": f"RUN#{run_id}", "sk": iteration_sk(i), "iteration": i, "created_at": 1}))
        table.put_item(Item=dynamo({"pk": f"RUN#{run_id}", "sk": worker_sk(i, 0), "worker": 0}))


def test_the_definition_has_the_runs_index_on_attributes_only_run_items_carry() -> None:
    arguments = records.create_table_arguments("t")
    assert arguments["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]
    assert arguments["GlobalSecondaryIndexes"] == [
        {
            "IndexName": "runs",
            "Projection": {"ProjectionType": "ALL"},
            "KeySchema": [
                {"AttributeName": "kind", "KeyType": "HASH"},
                {"AttributeName": "created_at", "KeyType": "RANGE"},
            ],
        }
    ]
    assert {a["AttributeName"]: a["AttributeType"] for a in arguments["AttributeDefinitions"]} == {
        "pk": "S",
        "sk": "S",
        "kind": "S",
        "created_at": "N",
    }
    registered = orchestration.definition("b", "t", "c", "e")["States"]["RegisterRun"]["Parameters"]["Item"]
    assert registered["kind"] == {"S": RUN_KIND} and "created_at" in registered


def test_a_run_item_stores_the_spec_once_beside_what_the_pipeline_updates(table: Any) -> None:
    registered = orchestration.definition("b", "t", "c", "e")["States"]["RegisterRun"]["Parameters"]["Item"]
    spec = TrainingSpec(workers=3, reducers=2, iterations=7, quorum=0.5, eval_every=3, deadline_floor=0.25)
    item = records.run_item("r", "d", spec, 5.0, "ab" * 32)
    assert item.keys() == registered.keys() - {"execution_arn"}  # as the state machine registers a run
    assert registered["training"] == {"S.$": "States.JsonToString($.training)"}
    assert registered["config_sha256"] == {"S.$": "$.config_sha256"}  # its run.json's, as launch_run gives it
    table.put_item(Item=item)
    run = RunTable(table).get_run("r")
    assert run.training == spec and run.workers == 3 and run.config_sha256 == "ab" * 32
    assert (run.iterations, run.reducers, run.quorum, run.deadline_s, run.heartbeat_s) == (
        7,
        2,
        0.5,
        spec.deadline_s,
        spec.heartbeat_s,
    )


def test_list_runs_queries_the_index_page_by_page_oldest_first(table: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    for n, run_id in enumerate(["c", "a", "e", "b", "d"]):
        register(table, run_id, now + [3, 1, 5, 2, 4][n])
    runs = RunTable(table)
    calls: list[dict[str, Any]] = []
    query = table.query

    def small_pages(**kwargs: Any) -> dict[str, Any]:
        calls.append(kwargs)
        return query(Limit=2, **kwargs)

    monkeypatch.setattr(table, "query", small_pages)
    monkeypatch.setattr(table, "scan", lambda **kwargs: pytest.fail("list_runs scanned the table"))
    listed = runs.list_runs()
    assert [r.run_id for r in listed] == ["a", "b", "c", "d", "e"]
    assert [r.iterations for r in listed] == [3] * 5
    assert len(calls) == 3 and all(c["IndexName"] == "runs" for c in calls)
    assert "ExclusiveStartKey" in calls[1] and "ExclusiveStartKey" in calls[2]


def test_items_without_the_kind_are_not_listed(table: Any) -> None:
    register(table, "real", 10.0)
    table.put_item(Item=dynamo({"pk": "RUN#stray", "sk": META, "run_id": "stray", "created_at": 5}))
    assert [r.run_id for r in RunTable(table).list_runs()] == ["real"]
    assert RunTable(table).list_runs()[0].created_at == 10.0


def test_the_run_advances_in_its_generation_only(table: Any) -> None:
    """A run registered before runs carried their generation advances in generation 0; once resumed, only its
    new generation moves it."""
    item = records.run_item("old", "d", TrainingSpec(workers=2, reducers=1, iterations=9), 1.0)
    del item["generation"]
    table.put_item(Item=item)
    runs = RunTable(table)
    assert runs.advance("old", 1, 0).iteration == 1
    assert runs.fail("old", "a failure for the test") is not None
    assert runs.resume("old", 1).generation == 1
    assert runs.advance("old", 2, 0) is None  # a late Merger of the generation before
    assert (runs.advance("old", 2, 1).iteration, runs.get_run("old").generation) == (2, 1)


def test_a_run_with_its_final_model_advances_no_more(table: Any) -> None:
    """Early stopping records the final model while an iteration is under way: its Merger does not move the run."""
    register(table, "stopped-early", 1.0, iterations=9)
    runs = RunTable(table)
    assert runs.advance("stopped-early", 3, 0).iteration == 3
    runs.record_outcome("stopped-early", "runs/stopped-early/final.keras", {"loss": 0.5}, None, "early stopping")
    assert runs.advance("stopped-early", 4, 0) is None
    run = runs.get_run("stopped-early")
    assert (run.iteration, run.reason, run.test_loss) == (3, "early stopping", 0.5)


def test_a_launch_delivered_twice_keeps_the_time_of_its_first_claim(table: Any) -> None:
    """A duplicate of the message that launched an iteration claims it again (the same trigger) after its reduce
    may have fired: the iteration's launch time stays the first claim's, so that the work phase (reduce fired −
    launched) the progress line, the tuner and the benchmarks read is never negative."""
    register(table, "twice", 1.0)
    runs = RunTable(table)
    first = runs.claim_launch("twice", 1, "models/1.json#0", workers=2)
    time.sleep(0.01)
    again = runs.claim_launch("twice", 1, "models/1.json#0", workers=3)
    assert again is not None and (again.launched_at, again.workers) == (first.launched_at, 2)
    assert runs.claim_launch("twice", 1, "another-trigger", workers=2) is None


def test_a_count_that_comes_after_a_resume_deleted_its_counter_stores_nothing(table: Any) -> None:
    """A late step of the generation before adds to the summary counts of an iteration the resume forgot: no
    item comes back for it (it would carry neither generation nor expiry)."""
    register(table, "forgotten", 1.0)
    runs = RunTable(table)
    runs.record_stale_shard("forgotten", 0, 1)
    runs.record_reduce_relaunch("forgotten", 0, 2)
    assert (runs.get_counter("forgotten", 0).stale_shards, runs.get_counter("forgotten", 0).reduce_relaunches) == (
        {1},
        2,
    )
    runs.forget_iterations("forgotten", 1)
    runs.record_stale_shard("forgotten", 1, 0)
    runs.record_reduce_relaunch("forgotten", 2, 1)
    counters = {iteration_sk(i) for i in range(3)}
    assert [item["sk"] for item in table.scan()["Items"] if item["sk"] in counters] == [iteration_sk(0)]


def _calls(table: Any) -> list[str]:
    """The DynamoDB operations the table's client makes from now on, in order (botocore's own events)."""
    made: list[str] = []
    table.meta.client.meta.events.register("before-call.dynamodb.*", lambda model, **_: made.append(model.name))
    return made


def test_the_watched_figures_of_every_evaluation_read_as_one_item_in_order(table: Any) -> None:
    """Early stopping's check at an epoch's end reads one item however many evaluations came before: the same
    requests at the 40th as at the 3rd; recorded out of order and twice, the series is each evaluation once, in
    order."""
    run = RunTable(table)
    monitors = ("val_auc", "test_loss")
    for iteration in [2, 0, 1, 1]:
        run.record_evaluation("r", iteration, "val", {"auc": 0.5 + iteration / 100, "loss": 1.0}, monitors)
    made = _calls(table)
    early = run.watched("r", "val_auc")
    at_third = list(made)
    for iteration in range(3, 40):
        run.record_evaluation("r", iteration, "val", {"auc": 0.5 + iteration / 100, "loss": 1.0}, monitors)
        run.record_evaluation("r", iteration, "test", {"auc": 0.4, "loss": 2.0 - iteration / 100}, monitors)
    made.clear()
    late = run.watched("r", "val_auc")
    assert at_third == made == ["GetItem"]
    assert early == [(i, pytest.approx(0.5 + i / 100)) for i in range(3)]
    assert late == [(i, pytest.approx(0.5 + i / 100)) for i in range(40)]
    assert run.watched("r", "test_loss") == [(i, pytest.approx(2.0 - i / 100)) for i in range(3, 40)]
    assert run.watched("r", "val_loss") == []  # not watched: kept with the iteration's figures only
    assert run.get_counter("r", 7).val == {"auc": pytest.approx(0.57), "loss": 1.0}


def test_a_resume_forgets_the_watched_figures_of_the_iterations_it_runs_again(table: Any) -> None:
    register(table, "r", 1.0, iterations=6)
    run = RunTable(table)
    for iteration in range(6):
        run.record_evaluation("r", iteration, "val", {"loss": 1.0 / (iteration + 1)}, ("val_loss",))
    run.forget_iterations("r", 4)
    assert [i for i, _ in run.watched("r", "val_loss")] == [0, 1, 2, 3]


def test_a_workers_next_round_is_computed_by_its_invocation_or_sent_by_the_launch_never_both(table: Any) -> None:
    """``stale_weights``: a worker's invocation takes its round of the next iteration unless the iteration's launch
    sent it Work; the launch sends Work for the rounds no invocation took, and one write decides each round."""
    runs = RunTable(table)
    assert runs.go_on("r", 5, 1, generation=0)
    assert not runs.go_on("r", 5, 1, generation=0)  # a duplicate invocation of the round before: one takes it
    assert runs.send_work("r", 5, 4) == [0, 2, 3]
    assert runs.send_work("r", 5, 4) == [0, 2, 3]  # a retry of the launch sends the same Work again
    assert not runs.go_on("r", 5, 0, generation=0)  # sent: a late worker's invocation ends
    counter = runs.get_counter("r", 5)
    assert (counter.went_on, counter.published) == ({1}, {0, 2, 3})
    # a worker that goes on after the launch read the counter: the launch's write fails, and it reads again
    real = runs.get_counter

    def read_then_go_on(run_id: str, iteration: int) -> records.Counter:
        read = real(run_id, iteration)
        if not read.went_on:
            assert runs.go_on(run_id, iteration, 2, generation=0)
        return read

    runs.get_counter = read_then_go_on  # type: ignore[method-assign]
    assert runs.send_work("r", 6, 3) == [0, 1]
    runs.get_counter = real  # type: ignore[method-assign]
    assert (runs.get_counter("r", 6).went_on, runs.get_counter("r", 6).published) == ({2}, {0, 1})
    # an invocation of an earlier generation takes no round of a resumed run's iteration
    runs.claim_launch("r", 7, "launch", generation=1, workers=2)
    assert not runs.go_on("r", 7, 0, generation=0) and runs.go_on("r", 7, 0, generation=1)
