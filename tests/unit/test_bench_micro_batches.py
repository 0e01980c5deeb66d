"""bench micro-batches on a tiny model: the micro-batch is the worker's own, each share is its multiple of it cut into
as many micro-batches as it takes, every step is timed, and a process's peak resident set is read, grows with the
share by less than computing its extra samples at once would add, and stays within the sizing's estimate and, the
warm cache full beside it, the function's memory; the report is drawn."""

from __future__ import annotations

import math
from pathlib import Path

import keras
import pytest

from slsml.aws import cache
from slsml.bench import microbatch as bench
from slsml.cli import display_bench
from slsml.rounds import sizing
from slsml.training import modelio

MEMORY_MB = 1600  # the tiny model's micro-batch at this memory: a few hundred samples
MULTIPLES, REPEATS = (1, 3), 2


def _tiny() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(16, 1, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(loss="sparse_categorical_crossentropy")
    return model


def test_each_share_is_its_multiple_of_the_workers_micro_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # the table drawn uncut, as into a pipe
    model = _tiny()
    path = tmp_path / "tiny.keras"
    path.write_bytes(modelio.save_model(model))
    report = bench.micro_batches(path, MEMORY_MB, MULTIPLES, REPEATS)

    sample_bytes = sizing.sample_bytes(model)
    fitting = sizing.WorkerMemory(
        MEMORY_MB, cache.MEMORY_SHARE * MEMORY_MB, 4 * model.count_params(), sample_bytes
    ).micro_batch()
    assert 100 <= fitting <= 2_000, "the memory gives the tiny model a micro-batch of a sensible size"
    assert report.fitting == report.micro_batch == fitting and report.sample_bytes == sample_bytes
    assert [c.multiple for c in report.cases] == list(MULTIPLES)
    for case in report.cases:
        assert case.share == case.multiple * fitting
        assert case.micro_batches == math.ceil(case.share / fitting)
        assert len(case.step_s) == REPEATS and all(s > 0 for s in case.step_s)
        assert case.ms_per_sample == pytest.approx(1e3 * case.median_step_s / case.share, rel=1e-2)
        assert case.peak_rss_mb is not None and 0 < case.imports_mb < case.peak_rss_mb
    assert report.cases[0].ratio == 1.0

    # the sizing holds: a one-layer model's step takes about three times its layer outputs a sample (the backward
    # pass's gradients, its input), which ``sizing.sample_bytes`` counts; each peak judged with the runtime at the
    # sizing's figure, as this machine's imports take what they take
    assert report.peaks_within_estimate and report.peaks_within_cache_full, report.cases
    # computing the larger share's extra samples at once would add what a sample takes of a step (``sample_bytes``,
    # its input among it); in micro-batches only the inputs held and two read ahead
    small, large = report.cases
    at_once_mb = (large.share - small.share) * sample_bytes / 2**20
    assert large.peak_rss_mb is not None and small.peak_rss_mb is not None
    assert large.peak_rss_mb - small.peak_rss_mb < at_once_mb

    display_bench.print_micro_batches(report)
    drawn = capsys.readouterr().out
    assert f"{fitting * 3:,}" in drawn and "ratio to 1×" in drawn and f"{MEMORY_MB:,} MB" in drawn
