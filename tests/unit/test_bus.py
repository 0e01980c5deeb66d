"""Publishing: batches within SNS's PublishBatch limits."""

from __future__ import annotations

from slsml.pipeline.bus import BATCH_BYTES, BATCH_ENTRIES, batches


def test_publish_batches_keep_within_the_sns_limits_on_entries_and_bytes() -> None:
    bodies = ["x" * 50_000] * 12 + ["y"] * 25  # Reduce messages of a 1000-worker run are about 45 KiB
    grouped = list(batches(bodies))
    assert [body for batch in grouped for body in batch] == bodies
    assert all(len(b) <= BATCH_ENTRIES and sum(len(x) for x in b) <= BATCH_BYTES for b in grouped)
    assert len(grouped[0]) == 5  # the size limit, not the entry limit, cut the first batch
