"""The JSON records the studio writes of its own objects: a named subset of an object's attributes, in order."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def fields_dict(obj: object, names: Iterable[str]) -> dict[str, Any]:
    """{name: obj.name} for each name, in the order given (a dataclass's fields or properties alike)."""
    return {name: getattr(obj, name) for name in names}
