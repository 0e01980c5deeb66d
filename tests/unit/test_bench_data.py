"""bench data's pieces: the .npy source it ingests and the means it takes over a run's usage lines."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from slsml.accounting.usage import UsageRecord
from slsml.bench import data as bench


def test_the_source_is_images_and_labels_written_chunk_by_chunk(tmp_path: Path) -> None:
    x_path, y_path = bench.write_source(tmp_path, bench.CHUNK + 5)
    x, y = np.load(x_path, mmap_mode="r"), np.load(y_path)
    assert x.shape == (bench.CHUNK + 5, *bench.SHAPE) and x.dtype == np.uint8 and y.dtype == np.int64
    assert x[-5:].any() and not np.array_equal(x[0], x[bench.CHUNK]), "every chunk is written, each its own"
    assert set(np.unique(y)) <= set(range(bench.CLASSES))


def test_the_means_leave_out_the_first_iteration_and_what_is_of_no_iteration() -> None:
    def line(iteration: int | None, read: int, gets: int) -> UsageRecord:
        return UsageRecord(
            run_id="r",
            iteration=iteration,
            function="worker",
            start=0,
            end=1,
            duration_s=1,
            memory_mb=3008,
            requests={"s3:GetObject": gets},
            bytes_read=read,
        )

    records = [
        line(0, 10**9, 500),
        line(None, 10**9, 500),
        line(1, 100, 2),
        line(1, 50, 1),
        line(2, 30, 3),
        line(3, 0, 0),
        line(4, 10**9, 9),
    ]
    assert bench._means(records, 4) == ((150 + 30 + 0) / 3, (3 + 3 + 0) / 3)
