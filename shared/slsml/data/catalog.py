"""The datasets of a bucket: listed from their manifests, found by where they came from, removed."""

from __future__ import annotations

from typing import Any

from slsml.aws.storage import ObjectStore
from slsml.data.datasets import load_manifest
from slsml.data.manifest import SCHEMA_VERSION, DatasetManifest, DatasetOrigin
from slsml.spec import keys
from slsml.spec.errors import BadInputError, NotFoundError

PREFIX = "datasets/"


def _names(store: ObjectStore) -> list[str]:
    """The names of the datasets with a manifest (an upload interrupted before it has none), sorted."""
    return sorted(
        key.split("/")[1]
        for key in store.list_keys(PREFIX)
        if key.count("/") == 2 and key == keys.dataset_manifest(key.split("/")[1])
    )


def listing(store: ObjectStore) -> list[dict[str, Any]]:
    """The summary of every dataset with a manifest, by name; one this slsml cannot read (a format no longer read)
    as its name and ``unreadable``: why, and what to do."""
    listed: list[dict[str, Any]] = []
    for name in _names(store):
        try:
            listed.append(summary(load_manifest(store, name)))
        except BadInputError as error:
            listed.append({"name": name, "unreadable": str(error)})
    return listed


def exists(store: ObjectStore, name: str) -> bool:
    return store.exists(keys.dataset_manifest(name))


def summary(manifest: DatasetManifest) -> dict[str, Any]:
    """What ``data show`` and ``data list`` say of a dataset: its samples, shapes, classes, bytes and origin."""
    origin = manifest.origin
    return {
        "name": manifest.name,
        "format": origin.format if origin else None,
        "train": manifest.train.count,
        "test": manifest.test.count,
        **_layout(manifest, "x"),
        **_layout(manifest, "y"),
        "weighted": manifest.weighted,
        "classes": manifest.classes,
        "class_names": list(origin.class_names) if origin and origin.class_names else None,
        "bytes": manifest.train.bytes + manifest.test.bytes,
        "shards": len(manifest.train.shards) + len(manifest.test.shards),
        "sha256": origin.sha256 if origin else None,
    }


def _layout(manifest: DatasetManifest, part: str) -> dict[str, Any]:
    """``<part>_shape`` and ``<part>_dtype`` of x or y: one array's, or of each named array by its name."""
    arrays = getattr(manifest, f"{part}_arrays")
    if arrays is None:
        return {
            f"{part}_shape": list(getattr(manifest, f"{part}_shape")),
            f"{part}_dtype": getattr(manifest, f"{part}_dtype"),
        }
    return {
        f"{part}_shape": {a.name: list(a.shape) for a in arrays},
        f"{part}_dtype": {a.name: a.dtype for a in arrays},
    }


def same_origin(store: ObjectStore, origin: DatasetOrigin) -> DatasetManifest | None:
    """A dataset read from the same content the same way, if there is one (one stored in a format no longer read is
    not: the source is uploaded again)."""
    for name in _names(store):
        stored = store.get_json(keys.dataset_manifest(name))
        if stored.get("schema_version") == SCHEMA_VERSION:
            manifest = DatasetManifest.model_validate(stored)
            if manifest.origin == origin:
                return manifest
    return None


def remove(store: ObjectStore, name: str) -> int:
    """Delete dataset ``name`` (NotFoundError if it does not exist), of any format: its manifest first, so that it is
    gone at once, then its shards. Returns how many objects were deleted."""
    if not exists(store, name):
        raise NotFoundError(f"dataset {name!r} does not exist")
    store.delete([keys.dataset_manifest(name)])
    shards = store.list_keys(f"{PREFIX}{name}/")
    store.delete(shards)
    return 1 + len(shards)
