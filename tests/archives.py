"""Small ``.keras`` archives that declare more than they hold: a zip bomb's expansion, a model's huge variables."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from typing import Any

import keras

from slsml.training import modelio

_SEED_WIDTH = 7  # the small model's input width and units: replaced in its config by the width declared


def small_model() -> bytes:
    model = keras.Sequential([keras.Input((_SEED_WIDTH,)), keras.layers.Dense(_SEED_WIDTH), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    return modelio.save_model(model)


def bomb(declared_bytes: int) -> bytes:
    """A small model's archive whose weights member declares ``declared_bytes`` once extracted (its local and
    central headers both say so, as a zip bomb's do)."""
    data = bytearray(small_model())
    # (signature, offset of the uncompressed size, of the name's length, of the name) of local and central headers
    for signature, size_at, length_at, name_at in ((b"PK\x03\x04", 22, 26, 30), (b"PK\x01\x02", 24, 28, 46)):
        start = data.find(signature)
        while start >= 0:
            (length,) = struct.unpack_from("<H", data, start + length_at)
            if data[start + name_at : start + name_at + length] == b"model.weights.h5":
                struct.pack_into("<I", data, start + size_at, declared_bytes)
            start = data.find(signature, start + 4)
    return bytes(data)


def declaring(width: int) -> bytes:
    """A small model's archive whose config declares ``Dense(width)`` on ``Input(width)``: weights it does not hold."""
    source = zipfile.ZipFile(io.BytesIO(small_model()))

    def widen(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: widen(value) for key, value in node.items()}
        if isinstance(node, list):
            return [widen(value) for value in node]
        return width if node == _SEED_WIDTH and not isinstance(node, bool) else node

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for member in source.infolist():
            body = source.read(member)
            if member.filename == "config.json":
                body = json.dumps(widen(json.loads(body))).encode()
            archive.writestr(member, body)
    return out.getvalue()
