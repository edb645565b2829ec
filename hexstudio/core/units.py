"""How the studio prints a measured quantity, one rule for the CLI, the GUI and the report: a rate in tok/s
with the precision a reader can use (16.4 tok/s, 948.3 tok/s, 1,204 tok/s; 2 decimals below 10: 7.93), a
time in ms whole above 10 ms. The stored figures (run.json, bench.json) keep their full precision."""

from __future__ import annotations

import math
from typing import Any


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def finite(v: Any) -> Any:
    """`v` with every NaN or infinity (a metric of a broken quantization) as None, in its lists and dicts too:
    what JSON can carry (json.dumps writes a bare NaN, which jq and browsers refuse)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    return v


def fmt_rate(v: Any, unit: str = "") -> str:
    """A rate (tok/s): 2 decimals below 10, 1 below 1,000, whole with thousands separators above; "—" when
    there is none. `unit` is appended after a space when given (fmt_rate(16.43, "tok/s") == "16.4 tok/s")."""
    f = _number(v)
    if f is None:
        s = "—"
    elif abs(f) < 10:
        s = f"{f:.2f}"
    elif abs(f) < 1000:
        s = f"{f:.1f}"
    else:
        s = f"{f:,.0f}"
    return f"{s} {unit}" if unit and s != "—" else s


def fmt_ms(v: Any, unit: str = "") -> str:
    """A time in milliseconds: 1 decimal below 10 ms, whole above (183.52 -> "184"); "—" when there is none."""
    f = _number(v)
    if f is None:
        s = "—"
    elif abs(f) < 10:
        s = f"{f:.1f}"
    else:
        s = f"{f:,.0f}"
    return f"{s} {unit}" if unit and s != "—" else s


def fmt_quantity(v: Any, unit: str | None) -> str | None:
    """fmt_rate / fmt_ms by the unit's name ("tok/s", "ms"), with the unit; None for any other unit."""
    if unit == "tok/s":
        return fmt_rate(v, unit)
    if unit == "ms":
        return fmt_ms(v, unit)
    return None


def nice_ceiling(v: float) -> float:
    """The next of 1, 2, 5 × 10^k at or above v: a chart's axis limit (the report's SVG charts, the GUI's plots,
    where it also keeps the axes from being redrawn on every update)."""
    if v <= 0:
        return 1.0
    k = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 5, 10):
        if m * k >= v:
            return float(m * k)
    return float(10 * k)


def fmt_duration(seconds: float) -> str:
    """A time span as a person reads it, the same on every face: "42 s", "3 min 05 s", "2 h 03 min"."""
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"
