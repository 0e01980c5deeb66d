"""bench data's ingests against the embedded cloud: a .npy and a folder of images of a given size each go through
`slsml data put` in a process of its own, measured, and leave neither their source nor their dataset behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from slsml.bench import data as bench_data
from slsml.bench import ingest as bench
from slsml.data import catalog
from slsml.local.runtime import LocalRuntime


def test_the_ingests_of_each_size_are_measured_and_removed(local: LocalRuntime, tmp_path: Path) -> None:
    assert local.deployment is not None
    store, gigabytes = local.services.store, 0.004
    measured = bench_data.sized_ingests(local.deployment, store, "sized", (gigabytes,))

    npy, images = measured
    sample_bytes = 32 * 32 * 3 + 8  # an image and its int64 label
    assert npy.kind == "npy" and npy.samples == round(gigabytes * 1e9 / sample_bytes)
    assert npy.source_bytes >= npy.samples * sample_bytes
    written = bench.write_image_folder(tmp_path / "again", round(gigabytes * 1e9))  # the same seed: the same files
    assert images.kind == "images" and images.source_bytes == written
    assert images.samples == sum(1 for p in (tmp_path / "again").rglob("*") if p.is_file())
    for ingest in measured:
        assert 50 < ingest.peak_rss_mb < bench.PEAK_MB
        assert ingest.mb_s == pytest.approx(ingest.source_bytes / ingest.seconds / 1e6, abs=0.1)
    assert not [key for key in store.list_keys(catalog.PREFIX) if "/sized-" in key], "no manifest or shard is left"
