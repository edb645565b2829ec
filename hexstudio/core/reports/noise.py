"""Mark a difference between runs better or worse only beyond the noise.

`compare.compare_reports` lines up the rows every run has, measured the same way (against the baseline, its
first column). This module decides what differs: a figure is *same* unless its change against the baseline is
larger than the noise, which is

- the measured run-to-run spread where the runs measured one (`hexstudio bench` keeps each cell's stdev):
  twice the combined stdev of the two runs, and never less than the stated tolerance;
- else a stated tolerance: timings and memory ±10 % (one measurement on a shared machine varies by several
  per cent from run to run), quality figures (validation, evaluation) ±2 %. Both can be changed.

Each judged cell says which noise it was held against. compare.compare_reports applies it; the CSV export
is written here.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from hexstudio.core.reports.bench import METRIC_LABELS

TIMING_TOLERANCE = 0.10
QUALITY_TOLERANCE = 0.02
TIMING = {
    "duration_s",
    "peak_rss_bytes",
    "init_ms",
    "ttft_ms",
    "gen_time_ms",
    "prompt_tok_s",
    "gen_tok_s",
    "predicted_decode_tok_s",
    "predicted_ttft_ms",
    *METRIC_LABELS,
}


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def bench_spreads(reports: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Each bench row's label -> every run's stdev of that median (the labels `bench.bench_rows` writes)."""
    out: dict[str, list[float | None]] = {}
    benches = [r.get("bench") or {} for r in reports]
    by = [{rt["runtime"]: rt for rt in b.get("runtimes") or []} for b in benches]
    for name in by[0] if by else {}:
        if not all(name in b for b in by):
            continue
        rts = [b[name] for b in by]
        out[f"{name} init (median)"] = [(rt.get("init_ms") or {}).get("stdev") for rt in rts]
        cells = [{(c["prompt_tokens"], c["fill_tokens"]): c for c in rt.get("cells") or []} for rt in rts]
        for key in cells[0] if cells else {}:
            if not all(key in cs for cs in cells):
                continue
            for metric, (label, _unit) in METRIC_LABELS.items():
                out[f"{name} {label}, prompt {key[0]} fill {key[1]} (median)"] = [
                    (cs[key].get(metric) or {}).get("stdev") for cs in cells
                ]
    return out


def judge_row(
    row: dict[str, Any],
    spreads: list[float | None] | None,
    tolerances: tuple[float, float],
    higher: set[str],
    lower: set[str],
) -> None:
    """Set the row's judgement of each run against values[0], held against the noise (row["noise"]): `higher`
    and `lower` name the figures where more (or less) is better."""
    name = row["name"]
    tol = tolerances[0] if name in TIMING else tolerances[1]
    base = row["values"][0]
    if row.get("section") == "settings":
        # a setting is what was asked, not a measurement: any difference is a difference, never noise
        row["noise"] = [None] * (len(row["values"]) - 1)
        row["judgement"] = ["same" if v == base else "changed" for v in row["values"][1:]]
        return
    row["judgement"], row["noise"] = [], []
    for i, v in enumerate(row["values"][1:], start=1):
        if not (_num(base) and _num(v) and base):
            row["noise"].append(None)
            row["judgement"].append("same" if v == base else "changed")
            continue
        noise, how = tol * abs(base), f"stated tolerance ±{tol * 100:g} %"
        sb, sv = (spreads[0], spreads[i]) if spreads else (None, None)
        if sb is not None and sv is not None:
            measured = 2 * (float(sb) ** 2 + float(sv) ** 2) ** 0.5
            if measured > noise:
                noise, how = measured, f"measured spread ±{measured:.3g} (2× the runs' stdev)"
        row["noise"].append({"abs": noise, "how": how})
        d = v - base
        if abs(d) <= noise:
            row["judgement"].append("same")
        elif name in higher:
            row["judgement"].append("better" if d > 0 else "worse")
        elif name in lower:
            row["judgement"].append("better" if d < 0 else "worse")
        else:
            row["judgement"].append("changed")


def chart_rows(c: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows worth a chart: numbers in every run, measured (not settings)."""
    return [r for r in c["rows"] if r["section"] != "settings" and all(_num(v) for v in r["values"])]


def compare_csv(c: dict[str, Any]) -> str:
    """One line per row: section, what, unit, each run's value, then each other run's change against the
    baseline (%), its judgement and the noise it was held against, then each run's source."""
    ids = [r["run_id"] for r in c["runs"]]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "section",
            "what",
            "unit",
            *[f"{rid} (baseline)" if i == 0 else rid for i, rid in enumerate(ids)],
            *[f"{rid} change %" for rid in ids[1:]],
            *[f"{rid} judgement" for rid in ids[1:]],
            *[f"{rid} noise" for rid in ids[1:]],
            *[f"{rid} source" for rid in ids],
        ]
    )
    for row in c["rows"]:
        noise = row.get("noise") or [None] * len(row["deltas"])
        # where each run's figure comes from (device, simulated, emulated, predicted): a simulated number is
        # never read as a device result once the file leaves the report
        sources = row.get("sources") or [""] * len(ids)
        w.writerow(
            [
                row["section"],
                _cell(row["label"]),
                row["unit"],
                *(_cell(v) for v in row["values"]),
                *["" if d is None else f"{d * 100:+.1f}" for d in row["deltas"]],
                *row["judgement"],
                *["" if n is None else n["how"] for n in noise],
                *[s or "" for s in sources],
            ]
        )
    return buf.getvalue()


def _cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: one that starts like a formula (=, +, -, @, a tab or a carriage
    return; a prompt or a suite name from the run) gets a leading apostrophe, as OWASP advises. Numbers stay
    numbers."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value
