"""DynamoDB item sizes and capacity units by the service's published rules (the embedded cloud reports
a flat 1 unit per call, so slsml computes them itself).

Item size: each attribute's name (UTF-8 bytes) plus its value: strings their UTF-8 bytes, numbers
about one byte per two significant digits plus one, binary its bytes, booleans and nulls one byte,
lists and maps 3 bytes plus one per element plus their elements (and a map's names), sets the sum of
their elements. A write costs one unit per started KB of the item (for an update, the larger of the
item before and after); a strongly consistent read one unit per started 4 KB, read units of a query
summing the items it returns.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

WRITE_UNIT_BYTES = 1024
READ_UNIT_BYTES = 4096


def value_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bool) or value is None:
        return 1
    if isinstance(value, int | float | Decimal):
        digits = len(Decimal(str(value)).normalize().as_tuple().digits)
        return math.ceil(digits / 2) + 1
    if isinstance(value, bytes | bytearray):
        return len(value)
    if isinstance(value, dict):
        return 3 + sum(1 + len(k.encode()) + value_bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return 3 + sum(1 + value_bytes(v) for v in value)
    if isinstance(value, set | frozenset):
        return sum(value_bytes(v) for v in value)
    raise TypeError(f"not a DynamoDB value: {type(value).__name__}")


def item_bytes(item: dict[str, Any]) -> int:
    """The size DynamoDB counts for an item (attribute names included)."""
    return sum(len(name.encode()) + value_bytes(value) for name, value in item.items())


def write_units(*item_sizes: int) -> int:
    """Write units of one write; for an update, give the item's size before and after."""
    return max(1, math.ceil(max(item_sizes, default=0) / WRITE_UNIT_BYTES))


def read_units(total_bytes: int, consistent: bool = True) -> float:
    units = max(1, math.ceil(total_bytes / READ_UNIT_BYTES))
    return units if consistent else units / 2
