"""What a function may load: an object's bytes, a ``.keras`` archive's expansion and a model's variables, each
bounded by the function's memory and ephemeral storage before it is read, extracted or built."""

from __future__ import annotations

import io
import os
import zipfile
from dataclasses import dataclass

from slsml.spec import wiring
from slsml.spec.deployment import DEFAULT_FUNCTIONS, FunctionSettings
from slsml.spec.errors import BadInputError

MB = 2**20
SIDECAR_MAX_BYTES = 64 * 2**10  # a drop-in's run request: a few options
ARCHIVE_MAX_MEMBERS = 1000  # a .keras archive holds its config, metadata, weights and a layer's few assets
CONFIG_MAX_BYTES = 16 * MB  # the model's config.json, parsed in memory
# Keras's loader peaks at 5.0× the bytes of a model's variables (peak RSS of keras.saving.load_model, dense models
# of 61 and 244 MB of variables, genuine and with a config declaring more than its weights file holds)
LOADING_COPIES = 5


@dataclass(frozen=True)
class Limits:
    """The memory and ephemeral storage of the function that loads a model."""

    memory_bytes: int
    storage_bytes: int

    @classmethod
    def of(cls, settings: FunctionSettings) -> Limits:
        return cls(settings.memory_mb * MB, settings.ephemeral_storage_mb * MB)

    @classmethod
    def here(cls) -> Limits:
        """This function's (from its environment); outside a function, the Worker's, which trains the model."""
        worker = DEFAULT_FUNCTIONS["worker"]
        memory = int(os.environ.get(wiring.MEMORY_ENV) or worker.memory_mb)
        storage = int(os.environ.get(wiring.STORAGE_ENV) or worker.ephemeral_storage_mb)
        return cls(memory * MB, storage * MB)

    @property
    def archive_bytes(self) -> int:
        """The largest archive this function reads: it is held in memory and written to its storage."""
        return min(self.memory_bytes, self.storage_bytes)

    def describe(self) -> str:
        memory, storage = self.memory_bytes // MB, self.storage_bytes // MB
        return f"a function with {memory} MB of memory and {storage} MB of storage"


def check_size(where: str, size: int, bound: int, what: str) -> None:
    """Refuse an object of ``size`` bytes above ``bound`` (``what``: the bound, in words), before it is read."""
    if size > bound:
        raise BadInputError(f"{where} is too large: {size:,} bytes, above {bound:,} ({what})")


def check_archive(data: bytes, where: str, limits: Limits) -> None:
    """Refuse a ``.keras`` archive whose members, once extracted, would not fit the function (a zip bomb), from
    its directory alone: nothing is extracted."""
    check_size(where, len(data), limits.archive_bytes, limits.describe())
    try:
        members = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except zipfile.BadZipFile:
        return  # the loader names what it is not
    if len(members) > ARCHIVE_MAX_MEMBERS:
        raise BadInputError(
            f"{where} has {len(members):,} members: a .keras archive has at most {ARCHIVE_MAX_MEMBERS:,}"
        )
    expanded = sum(member.file_size for member in members)
    room = limits.storage_bytes - len(data)  # the archive itself is written there first
    if expanded > room:
        raise BadInputError(
            f"{where} expands to {expanded:,} bytes from {len(data):,}: above the {room:,} that"
            f" {limits.describe()} has room for"
        )
    config = next((member for member in members if member.filename == "config.json"), None)
    if config is not None:
        check_size(f"{where}'s config.json", config.file_size, CONFIG_MAX_BYTES, "a model's configuration")


def check_variables(where: str, variable_bytes: int, slots: int, archive_bytes: int, limits: Limits) -> None:
    """Refuse a model whose variables (``variable_bytes``, loaded, then with ``slots`` optimizer slots each) and
    archive would not fit the function's memory, before they are built."""
    needed = variable_bytes * (LOADING_COPIES + slots) + archive_bytes
    if needed > limits.memory_bytes:
        raise BadInputError(
            f"{where} declares {variable_bytes:,} bytes of weights: loading them takes"
            f" {LOADING_COPIES}× that, its optimizer's slots {slots}× more, {needed:,} bytes with"
            f" its archive, above the {limits.memory_bytes:,} of memory of its loader"
        )
