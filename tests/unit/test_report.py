"""The report's pieces from records: an iteration's timeline, the iterations drawn, curves, faults, traces, and
the page: escaped, its PNGs referenced relatively, the summary's figures as ``runs.summarize`` gives them."""

from __future__ import annotations

import json
import re
import statistics
from html.parser import HTMLParser
from pathlib import Path

import pytest

from slsml.accounting import usage
from slsml.accounting.prices import PriceTable
from slsml.accounting.usage import UsageRecord
from slsml.aws.storage import etag_of
from slsml.cli import report, report_charts, report_page, report_timeline
from slsml.client import runs
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError
from slsml.spec.messages import Participant
from slsml.state.records import DEADLINE_OWNER, IterationRecord, RunRecord, RunStatus, WorkerReport

PRICES = PriceTable(
    lambda_gb_second=1.0,
    lambda_request=0.5,
    s3_put=0.01,
    s3_get=0.001,
    sns_publish=0.1,
    sqs_request=0.0,
    dynamodb_write_unit=2.0,
    dynamodb_read_unit=1.0,
)
T0 = 1_000.0  # iteration 1's launch


def use(
    function: str,
    start: float,
    end: float,
    iteration: int | None = 1,
    requests: dict[str, int] | None = None,
    **part: object,
) -> UsageRecord:
    return UsageRecord(
        run_id="r",
        iteration=iteration,
        function=function,
        start=start,
        end=end,
        duration_s=end - start,
        memory_mb=1024,
        requests=requests or {},
        **part,
    )


def iteration_one() -> list[UsageRecord]:
    """W = 3, R = 2: worker 2 is late; its ReduceLauncher comes after worker 1's fired; a deadline wakes the
    watchdog long after the merge; records of iteration 2 are mixed in."""
    return [
        use("merger", T0 + 0.70, T0 + 0.80, shard=1, requests={"s3:PutObject": 2}),
        use("worker", T0 + 0.10, T0 + 0.30, worker=1, attempt=0),
        use("work_launcher", T0, T0 + 0.05, requests={"sns:PublishBatch": 1}),
        use("worker", T0 + 0.10, T0 + 0.25, worker=0, attempt=0),
        use("worker", T0 + 0.10, T0 + 0.90, worker=2, attempt=0),
        use("reduce_launcher", T0 + 0.26, T0 + 0.28, worker=0, attempt=0),
        use("reduce_launcher", T0 + 0.31, T0 + 0.40, worker=1, attempt=0, requests={"sns:PublishBatch": 1}),
        use("reduce_launcher", T0 + 0.91, T0 + 0.93, worker=2, attempt=0),
        use("reducer", T0 + 0.42, T0 + 0.60, shard=1),
        use("reducer", T0 + 0.41, T0 + 0.65, shard=0),
        use("merger", T0 + 0.61, T0 + 0.62, shard=0),
        use("watchdog", T0 + 120.0, T0 + 120.01, stage="work"),
        use("worker", T0 + 1.10, T0 + 1.20, iteration=2, worker=0, attempt=0),
    ]


def test_a_timeline_names_each_stage_of_a_worker_in_pipeline_stages() -> None:
    """Each worker's round in two stage invocations (its usage records name the stage): a bar per stage, in the
    worker's order and then its stages'; a run in one stage names none."""
    staged = [
        use("worker", T0 + 0.10, T0 + 0.40, worker=1, pipeline_stage=1, attempt=0),
        use("worker", T0 + 0.10, T0 + 0.50, worker=0, pipeline_stage=1, attempt=0),
        use("worker", T0 + 0.10, T0 + 0.60, worker=1, pipeline_stage=0, attempt=0),
        use("worker", T0 + 0.10, T0 + 0.70, worker=0, pipeline_stage=0, attempt=0),
        use("work_launcher", T0, T0 + 0.05),
    ]
    line = report_timeline.timeline(1, staged)
    assert [b.label for b in line.bars] == [
        "WorkLauncher",
        "Worker 0 stage 0",
        "Worker 0 stage 1",
        "Worker 1 stage 0",
        "Worker 1 stage 1",
    ]
    assert [b.end_s for b in line.bars[1:]] == pytest.approx([0.70, 0.50, 0.60, 0.40])
    one_stage = [r.model_copy(update={"pipeline_stage": 0}) for r in staged]
    assert "Worker 0" in [b.label for b in report_timeline.timeline(1, one_stage).bars]


def record_one(**fields: object) -> IterationRecord:
    return IterationRecord(
        iteration=1,
        launched_at=T0 + 0.01,
        reduce_fired_by=1,
        reduce_fired_at=T0 + 0.35,
        merged_at=T0 + 0.75,
        merge_fired_by=1,
        participant_count=2,
        reports={w: WorkerReport(worker=w, samples=32) for w in range(3)},
        participants=[Participant(worker=w, samples=32, etag=etag_of(bytes([w]))) for w in (0, 1)],
        **fields,
    )


def test_a_timeline_lays_out_the_iterations_invocations_in_chain_order_from_its_launch() -> None:
    line = report_timeline.timeline(1, iteration_one(), record_one(), "median", 1.5)
    assert [b.label for b in line.bars] == [
        "WorkLauncher",
        "Worker 0",
        "Worker 1",
        "Worker 2",
        "ReduceLauncher ← worker 0",
        "ReduceLauncher ← worker 1",
        "ReduceLauncher ← worker 2",
        "Reducer shard 0",
        "Reducer shard 1",
        "Merger ← shard 0",
        "Merger ← shard 1",
    ]
    assert [b.row for b in line.bars] == list(range(11))
    assert line.origin == T0 and line.bars[0].start_s == 0.0
    by_label = {b.label: b for b in line.bars}
    assert (by_label["Worker 2"].start_s, by_label["Worker 2"].end_s) == pytest.approx((0.10, 0.90))
    assert by_label["Worker 2"].note == "late" and by_label["ReduceLauncher ← worker 2"].note == "late"
    assert by_label["ReduceLauncher ← worker 1"].note == "fires the reduce"
    assert by_label["Merger ← shard 1"].note == "merges" and by_label["Merger ← shard 0"].note == ""
    assert by_label["Worker 0"].note == ""
    marks = dict(line.marks)
    assert marks == pytest.approx({"reduce fired (on worker 1)": 0.35, "merged": 0.75, "next iteration launched": 1.51})
    assert len(line.left_out) == 1 and line.left_out[0].startswith("Watchdog (work deadline) at +120.00 s")


def test_a_timeline_marks_re_launched_attempts_a_deadline_fire_and_stale_shards() -> None:
    records = [
        use("work_launcher", T0, T0 + 0.05),
        use("worker", T0 + 0.1, T0 + 0.2, worker=0, attempt=0),
        use("watchdog", T0 + 3.0, T0 + 3.1, stage="work", requests={"sns:PublishBatch": 1}),
        use("worker", T0 + 3.2, T0 + 3.4, worker=1, attempt=1),
        use("reducer", T0 + 3.5, T0 + 3.6, shard=0, attempt=1),
    ]
    record = IterationRecord(
        iteration=1, reduce_fired_by=DEADLINE_OWNER, reduce_fired_at=T0 + 3.05, relaunched={1: 1}, stale_shards={0}
    )
    line = report_timeline.timeline(1, records, record)  # not merged: the watchdog is drawn wherever it falls
    notes = {b.label: b.note for b in line.bars}
    assert notes == {
        "WorkLauncher": "",
        "Worker 0": "",
        "Worker 1": "attempt 1",
        "Reducer shard 0": "attempt 1, stale shard",
        "Watchdog (work deadline)": "acts",
    }
    assert dict(line.marks) == pytest.approx({"reduce fired (by the watchdog at a deadline)": 3.05})
    assert line.left_out == ()


def test_a_timeline_without_part_fields_or_an_iteration_record_still_draws() -> None:
    records = [use("worker", T0 + 1, T0 + 2), use("merger", T0 + 3, T0 + 4, requests={"s3:PutObject": 2})]
    line = report_timeline.timeline(1, records)
    assert [(b.label, b.note, b.start_s) for b in line.bars] == [("Worker", "", 0.0), ("Merger", "merges", 2.0)]


def test_the_slowest_and_a_median_iteration_are_drawn_with_those_chosen() -> None:
    seconds = {0: 5.0, 1: 1.0, 2: 1.2, 3: 0.9}
    assert report_timeline.choose(seconds) == [(0, "slowest"), (1, "median")]  # of an even count, the lower median
    assert report_timeline.choose(seconds, [1, 3]) == [(0, "slowest"), (1, "median, chosen"), (3, "chosen")]
    assert report_timeline.choose({4: 2.0}) == [(4, "slowest, median")]
    assert report_timeline.choose({}, [2]) == [(2, "chosen")]


def test_iteration_seconds_are_the_ones_the_summary_takes_its_median_of() -> None:
    launched = [0.0, 5.0, 6.0, 7.2, 8.1]
    iterations = [IterationRecord(iteration=i, launched_at=T0 + t) for i, t in enumerate(launched)]
    seconds = report_timeline.iteration_seconds(iterations)
    assert seconds == pytest.approx({0: 5.0, 1: 1.0, 2: 1.2, 3: 0.9})
    run = RunRecord(
        run_id="r",
        status=RunStatus.COMPLETED,
        training=TrainingSpec(workers=1, reducers=1, iterations=5),
        iteration=5,
        workers=1,
        dataset="d",
        created_at=T0,
        updated_at=T0 + 9,
    )
    assert runs.summarize(run, iterations, 9.0).median_iteration_s == pytest.approx(statistics.median(seconds.values()))


def test_curves_add_up_the_dollars_through_each_iteration() -> None:
    run = RunRecord(
        run_id="r",
        status=RunStatus.COMPLETED,
        training=TrainingSpec(workers=1, reducers=1, iterations=2),
        iteration=2,
        workers=1,
        dataset="d",
        created_at=T0 - 10,
        updated_at=T0 + 9,
    )
    records = [
        use("work_launcher", T0 - 9, T0 - 8, iteration=None, requests={"s3:PutObject": 1}),
        use("worker", T0, T0 + 1, iteration=0, requests={"s3:GetObject": 10}),
        use("worker", T0 + 2, T0 + 3, iteration=1, requests={"s3:GetObject": 10}),
    ]
    iterations = [
        IterationRecord(iteration=0, train_loss=2.0, merged_at=T0 + 1.5),
        IterationRecord(iteration=1, train_loss=1.5, test={"loss": 1.4, "accuracy": 0.6}, merged_at=T0 + 3.5),
    ]
    first, second = report_charts.curves(run, iterations, records, PRICES)
    invocation = 1 / 1024 * 1024 * 1.0 + 0.5  # 1 GB-s at $1, and the request at $0.50
    assert first.dollars == pytest.approx(invocation + 0.01 + invocation + 0.01)
    assert second.dollars == pytest.approx(first.dollars + invocation + 0.01)
    assert (first.wall_s, second.wall_s) == pytest.approx((11.5, 13.5))
    assert (first.test, second.test, second.train) == ({}, {"loss": 1.4, "accuracy": 0.6}, {"loss": 1.5})


def test_usage_by_function_in_chain_order_with_requests_and_dollars_by_service() -> None:
    uses = report_charts.by_function(iteration_one(), PRICES)
    assert [u.function for u in uses] == ["work_launcher", "worker", "reduce_launcher", "reducer", "merger", "watchdog"]
    merger = uses[4]
    assert (merger.invocations, merger.requests) == (2, {"s3": 2})
    assert merger.dollars["s3"] == pytest.approx(0.02) and merger.total_dollars == pytest.approx(
        sum(merger.dollars.values())
    )
    assert uses[1].invocations == 4 and uses[1].seconds == pytest.approx(0.2 + 0.15 + 0.8 + 0.1)


def test_faults_say_what_happened_and_what_the_pipeline_did() -> None:
    run = RunRecord(
        run_id="r",
        status=RunStatus.FAILED,
        training=TrainingSpec(workers=3, reducers=2, iterations=5),
        iteration=2,
        workers=3,
        dataset="d",
        created_at=T0,
        updated_at=T0,
        reason="work stage of iteration 2: …",
    )
    iterations = [
        record_one(relaunched={2: 1}, dropped_parts={"1:0"}, stale_shards={1}, stale_attempts=2, reduce_relaunches=1),
        IterationRecord(
            iteration=0,
            reduce_fired_by=DEADLINE_OWNER,
            participants=[Participant(worker=0, samples=1, etag=etag_of(b""))],
            reports={0: WorkerReport(worker=0, samples=1), 1: WorkerReport(worker=1, samples=1, finite=False)},
        ),
    ]
    found = [(f.iteration, f.what, f.done) for f in report_page.faults(run, iterations)]
    assert found == [
        (0, "the work stage passed its deadline with 1 of 3 workers in", "the watchdog fired the reduce with them"),
        (0, "worker 1 sent a NaN or Inf update", "left out of the average"),
        (1, "worker 2 missing at a deadline", "the watchdog re-launched them: worker 2 (attempt 1)"),
        (1, "worker 2 reported after the reduce fired", "their updates were left out (late)"),
        (
            1,
            "parts not read within the read timeout: shard 1 ← worker 0",
            "dropped; the average is weighted by the parts read",
        ),
        (1, "1 reducer launch(es) missing at a deadline", "the watchdog re-launched them"),
        (
            1,
            "no reducer finished shard 1 within the retries",
            "the shard kept the iteration's weights (stale) and the merge went on",
        ),
        (1, "2 report(s) of superseded attempts", "ignored"),
        (None, "the run failed: work stage of iteration 2: …", "no new iteration started after iteration 2"),
    ]


def test_traces_per_iteration_the_launchs_first() -> None:
    records = [
        use("worker", T0 + 1, T0 + 2, trace_id="1-b"),
        use("work_launcher", T0 + 5, T0 + 6, trace_id="1-a"),
        use("merger", T0 + 7, T0 + 8, trace_id="1-b"),
        use("worker", T0, T0 + 1, iteration=2),
        use("worker", T0, T0 + 1, iteration=None, trace_id="1-c"),
    ]
    assert report_page.traces(records) == {1: ["1-a", "1-b"]}
    assert report_page.trace_url("1-a", "eu-west-1") == (
        "https://eu-west-1.console.aws.amazon.com/cloudwatch/home?region=eu-west-1#xray:traces/1-a"
    )


class _Page(HTMLParser):
    """What a browser would load and show: images, scripts, the summary's figures."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.scripts: list[dict[str, str | None]] = []
        self.figures: dict[str, list[tuple[str, str]]] = {}
        self._field: tuple[str, str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "img":
            self.images.append(attributes["src"])
        if tag == "script":
            self.scripts.append(attributes)
        if "data-field" in attributes:
            self._field = (attributes["data-field"], attributes["data-value"])

    def handle_data(self, data: str) -> None:
        if self._field is not None:
            name, value = self._field
            self.figures.setdefault(name, []).append((value, data))
            self._field = None

    def handle_endtag(self, tag: str) -> None:
        if self._field is not None:  # an empty figure
            raise AssertionError(f"{self._field[0]} is shown as nothing")


def _report(tmp_path: Path, reason: str | None = None) -> tuple[report_page.Report, runs.RunSummary]:
    run = RunRecord(
        run_id="r<1>",
        status=RunStatus.COMPLETED,
        training=TrainingSpec(workers=3, reducers=2, iterations=3),
        iteration=3,
        workers=3,
        dataset="d&d",
        created_at=T0 - 10,
        updated_at=T0 + 9,
        reason=reason,
    )
    records = [*iteration_one(), use("work_launcher", T0 + 1.5, T0 + 1.6, iteration=2)]
    iterations = [
        IterationRecord(iteration=0, launched_at=T0 - 1, train_loss=2.0, train={"loss": 2.0, "accuracy": 0.1}),
        record_one(
            train_loss=1.8,
            train={"loss": 1.8, "accuracy": 0.3},
            test_loss=1.7,
            test_accuracy=0.42,
            test={"loss": 1.7, "accuracy": 0.42, "auc": 0.8},
            val={"loss": 1.9, "accuracy": 0.4},
        ),
        IterationRecord(iteration=2, launched_at=T0 + 1.51),
    ]
    summary = runs.summarize(run, iterations, 19.0, records)
    gathered = report.gather(run, iterations, records, summary, chosen=[2], table=PRICES)
    report.draw(gathered, tmp_path)
    return gathered, summary


def test_the_page_shows_the_summarys_figures_escaped_with_its_pngs_beside_it(tmp_path: Path) -> None:
    gathered, summary = _report(tmp_path, reason="<script>alert(1)</script> & more")
    page = report_page.render(gathered)
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    parsed = _Page()
    parsed.feed(page)
    assert parsed.scripts == [{"type": "application/json", "id": "summary-json"}]  # data, never run
    assert sorted(parsed.images) == sorted(gathered.images.values())
    assert all("/" not in src and (tmp_path / src).stat().st_size > 1000 for src in parsed.images)
    assert set(gathered.images) == {"curves", "cost", "timeline-0", "timeline-1", "timeline-2"}
    dumped = summary.model_dump(mode="json")
    assert set(parsed.figures) == set(dumped)
    for name, shown in parsed.figures.items():
        for value, text in shown:
            assert json.loads(value) == dumped[name], name
            assert text == report_page.shown(name, dumped[name]), name
    assert parsed.figures["test_accuracy"][0][1] == "–"  # the run's, not an iteration's
    assert parsed.figures["median_iteration_s"][0][1] == f"{summary.median_iteration_s:.3f} s"
    embedded = re.search(r'<script type="application/json" id="summary-json">(.*?)</script>', page).group(1)
    assert json.loads(embedded) == dumped
    assert "X-Ray traces: none" in page


def test_chosen_iterations_must_be_the_runs(tmp_path: Path) -> None:
    run = RunRecord(
        run_id="r",
        status=RunStatus.COMPLETED,
        training=TrainingSpec(workers=1, reducers=1, iterations=1),
        iteration=1,
        workers=1,
        dataset="d",
        created_at=T0,
        updated_at=T0,
    )
    summary = runs.summarize(run, [], 1.0)
    with pytest.raises(BadInputError, match=r"--iteration 7: not an iteration of run 'r' \(its iterations: 1–1\)"):
        report.gather(run, [], [use("worker", T0, T0 + 1)], summary, chosen=[7], table=PRICES)


def test_summary_figures_as_shown() -> None:
    assert report_page.shown("test_accuracy", 0.95312) == "0.9531"
    assert report_page.shown("median_iteration_s", 0.37312) == "0.373 s"
    assert report_page.shown("cost_usd", 0.000123456) == "$0.000123" and report_page.shown("cost_usd", 12.5) == "$12.50"
    assert report_page.shown("overhead_share", 0.9712) == "97.1%"
    assert report_page.shown("status", "COMPLETED") == "COMPLETED" and report_page.shown("reason", None) == "–"
    assert report_page.shown("cost_by_service_usd", {"s3": 0.001, "lambda": 0.002}) == "lambda $0.002, s3 $0.001"


def test_the_report_command_reads_a_stack_and_says_where_a_local_runs_report_comes_from(capsys) -> None:
    from slsml.cli import main as cli

    args = cli.build_parser().parse_args(
        ["run", "report", "r", "--out", "d", "--iteration", "3", "5", "--iteration", "7"]
    )
    assert (args.run_id, args.out, args.iteration, args.stack) == ("r", "d", [3, 5, 7], None)
    assert cli.main(["run", "report", "r", "--out", "d"]) == 2
    assert "no local service is up and no --stack given" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["demo", "--report", "out"]).report == "out"


def test_the_curves_and_tables_name_the_figures_as_keras_does(tmp_path: Path) -> None:
    gathered, _ = _report(tmp_path)
    drawn = {name: [label for label, _ in lines] for name, lines in report_charts.series(gathered.points).items()}
    assert drawn == {
        "loss": ["loss", "test_loss", "val_loss"],
        "accuracy": ["accuracy", "test_accuracy", "val_accuracy"],
    }
    page = report_page.render(gathered)
    assert 'alt="loss, test_loss, val_loss and accuracy, test_accuracy, val_accuracy against iterations' in page
    assert "<th>test_loss</th><th>test_accuracy</th><th>test_auc</th><th>val_loss</th><th>val_accuracy</th>" in page
    assert "<th>loss</th><th>accuracy</th><th>test_accuracy</th>" in page  # every iteration: the first metric
    auc = [
        report_charts.Point(
            iteration=i,
            wall_s=None,
            dollars=0.0,
            train={"loss": 0.5, "accuracy": 0.7},
            test={"loss": 0.6, "auc": 0.9} if i else {},
        )
        for i in range(2)
    ]
    assert {name: [label for label, _ in lines] for name, lines in report_charts.series(auc).items()} == {
        "loss": ["loss", "test_loss"],
        "auc": ["test_auc"],
    }  # no AUC over the batches here: only the evaluated one
    report_charts.draw_curves(auc, tmp_path / "auc.png")
    assert (tmp_path / "auc.png").stat().st_size > 1000


def test_a_timeline_notes_a_workers_micro_batches_and_how_long_compute_waited_for_their_reads() -> None:
    streamed = usage.Streamed(micro_batch=6, micro_batches=22, read_s=3.21, waited_s=0.05, compute_s=43.0)
    whole = usage.Streamed(micro_batch=64, micro_batches=1, read_s=0.2, waited_s=0.2, compute_s=1.0)
    records = [
        use("worker", T0 + 0.1, T0 + 50.0, worker=0, attempt=0, streamed=streamed),
        use("worker", T0 + 0.1, T0 + 2.0, worker=1, attempt=0, streamed=whole),
    ]
    notes = {b.label: b.note for b in report_timeline.timeline(1, records).bars}
    assert notes == {"Worker 0": "22 micro-batches of ≤6, reads 3.21 s (0.05 s waited)", "Worker 1": ""}
