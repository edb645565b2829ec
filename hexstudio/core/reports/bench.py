"""`hexstudio bench` results in the run report and in Compare: the latest benchmark of a run
(<run>/artifacts/bench/bench.json, hexstudio/core/genie/bench.py), its tables and plots, and the rows two runs
share. A simulated figure is labeled and never set against a device one; published figures stay labeled
as published."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hexstudio.core.reports.svg import Series, line_chart

METRIC_LABELS = {
    "ttft_ms": ("TTFT", "ms"),
    "prompt_tok_s": ("prefill", "tok/s"),
    "gen_tok_s": ("decode", "tok/s"),
}
STAT_KEYS = ("n", "median", "stdev", "min", "max")


def _stat(s: Any) -> dict[str, Any]:
    s = s if isinstance(s, dict) else {}
    return {k: s.get(k) for k in STAT_KEYS}


def bench_section(path: Path) -> dict[str, Any] | None:
    """The report's view of a run's latest benchmark: per runtime its version, source, init and per cell
    (prompt length x context fill) the median, spread and range of each metric. None when the run has none
    (or the file is unreadable: a report never fails on it)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("runtimes"), list):
        return None
    proto = doc.get("protocol") or {}
    runtimes = []
    for rt in doc["runtimes"]:
        cells = [
            {
                "prompt_tokens": c.get("prompt_tokens"),
                "fill_tokens": c.get("fill_tokens"),
                **{m: _stat((c.get("stats") or {}).get(m)) for m in METRIC_LABELS},
            }
            for c in rt.get("cells") or []
        ]
        runtimes.append(
            {
                "runtime": rt.get("runtime"),
                "runtime_version": rt.get("runtime_version"),
                "simulated": bool(rt.get("simulated")),
                "source": rt.get("source") or ("simulated" if rt.get("simulated") else "device"),
                "context_length": rt.get("context_length"),
                "init_ms": _stat(rt.get("init_ms")),
                "cells": cells,
            }
        )
    return {
        "created": doc.get("created"),
        "board": doc.get("board_label") or doc.get("board"),
        "protocol": {k: proto.get(k) for k in ("warmup", "runs", "gen_tokens", "init_runs", "statistics")},
        "runtimes": runtimes,
        "published": [
            {
                k: p.get(k)
                for k in ("model", "device", "runtime", "gen_tok_s", "ttft_ms", "conditions", "source", "url")
            }
            for p in doc.get("published") or []
            if isinstance(p, dict)
        ],
    }


def bench_plots(section: dict[str, Any] | None) -> list[str]:
    """Decode rate and TTFT against the prompt length, one line per runtime and context fill, the spread
    named in the legend (median ± stdev of the cell with the widest spread)."""
    if not section:
        return []
    out = []
    for metric in ("gen_tok_s", "ttft_ms"):
        label, unit = METRIC_LABELS[metric]
        series = []
        for rt in section["runtimes"]:
            fills = sorted({c["fill_tokens"] or 0 for c in rt["cells"]})
            for fill in fills:
                cells = sorted(
                    (
                        c
                        for c in rt["cells"]
                        if (c["fill_tokens"] or 0) == fill and c[metric]["median"] is not None
                    ),
                    key=lambda c: c["prompt_tokens"] or 0,
                )
                if not cells:
                    continue
                spread = max(float(c[metric]["stdev"] or 0.0) for c in cells)
                series.append(
                    Series(
                        f"{rt['runtime']} ({rt['source']}), fill {fill} tokens, spread ≤ ±{spread:.3g}",
                        [(float(c["prompt_tokens"] or 0), float(c[metric]["median"])) for c in cells],
                    )
                )
        sources = sorted({rt["source"] for rt in section["runtimes"]})
        svg = line_chart(
            series,
            title=f"Benchmark {label} (median, {', '.join(sources)})",
            x_label="prompt tokens",
            y_label=unit,
        )
        if svg:
            out.append(svg)
    return out


def bench_rows(
    reports: list[dict[str, Any]], skipped: list[str], make_row: Callable[..., dict[str, Any]]
) -> list[dict[str, Any]]:
    """Compare rows: each runtime's init and each cell's medians that every run measured, on the same kind
    of board (simulated or device) with the same runtime."""
    benches = [r.get("bench") for r in reports]
    if not any(benches):
        return []
    if not all(benches):
        skipped.append("Benchmark: not every run has a `hexstudio bench` result.")
        return []
    rows: list[dict[str, Any]] = []
    by = [{rt["runtime"]: rt for rt in b["runtimes"]} for b in benches if b]
    for name in by[0]:
        if not all(name in b for b in by):
            skipped.append(f"Benchmark {name}: not every run benchmarked this runtime.")
            continue
        rts = [b[name] for b in by]
        sources = [rt["source"] for rt in rts]
        if len(set(sources)) > 1:
            skipped.append(
                f"Benchmark {name}: the runs measured it on different kinds of board "
                f"({', '.join(sources)}); a simulated figure says nothing about a device one."
            )
            continue
        if all(rt["init_ms"]["median"] is not None for rt in rts):
            rows.append(
                make_row(
                    "bench",
                    "init_ms",
                    f"{name} init (median)",
                    [rt["init_ms"]["median"] for rt in rts],
                    "ms",
                    sources,
                )
            )
        cells = [{(c["prompt_tokens"], c["fill_tokens"]): c for c in rt["cells"]} for rt in rts]
        for key in cells[0]:
            if not all(key in cs for cs in cells):
                continue
            for metric, (label, unit) in METRIC_LABELS.items():
                vals = [cs[key][metric]["median"] for cs in cells]
                if any(v is None for v in vals):
                    continue
                rows.append(
                    make_row(
                        "bench",
                        metric,
                        f"{name} {label}, prompt {key[0]} fill {key[1]} (median)",
                        vals,
                        unit,
                        sources,
                    )
                )
    return rows
