"""Compare runs side by side (float vs W4A16, two models on one board, ...): like-for-like rows only,
the first run is the baseline, deltas beyond 5 % are highlighted as better or worse."""

from __future__ import annotations

import html
from typing import Any

from app.core.manifest import now_iso
from app.core.reports.render import ReportError

SIGNIFICANT = 0.05
HIGHER_IS_BETTER = {"prompt_tok_s", "gen_tok_s", "top1_agreement", "greedy_agreement"}
LOWER_IS_BETTER = {"init_ms", "ttft_ms", "gen_time_ms", "kl_divergence", "perplexity_ratio", "salad_score",
                   "duration_s", "peak_rss_bytes"}


def _row(section: str, name: str, label: str, values: list[Any], unit: str = "",
         sources: list[str] | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"section": section, "name": name, "label": label, "unit": unit, "values": values,
                           "sources": sources, "deltas": [], "judgement": []}
    base = values[0]
    for v in values[1:]:
        if isinstance(base, (int, float)) and isinstance(v, (int, float)) and not isinstance(v, bool) and base:
            d = (v - base) / abs(base)
            row["deltas"].append(round(d, 4))
            if abs(d) < SIGNIFICANT:
                row["judgement"].append("same")
            elif name in HIGHER_IS_BETTER:
                row["judgement"].append("better" if d > 0 else "worse")
            elif name in LOWER_IS_BETTER:
                row["judgement"].append("better" if d < 0 else "worse")
            else:
                row["judgement"].append("changed")
        else:
            row["deltas"].append(None)
            row["judgement"].append("same" if v == base else "changed")
    return row


def compare_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    if len(reports) < 2:
        raise ReportError("Compare needs at least two runs.", "Give two or more run ids.")
    rows: list[dict[str, Any]] = []
    # settings present in every run
    keys = [k for k in reports[0]["settings"] if all(k in r["settings"] for r in reports)]
    rows += [_row("settings", k, k, [r["settings"][k] for r in reports]) for k in keys]
    model_row = _row("settings", "model", "model", [r["model"]["id"] for r in reports])
    rows.insert(0, model_row)
    measured: list[dict[str, Any]] = []
    # stages completed in every run
    for i, st in enumerate(reports[0]["stages"]):
        if st["name"] == "report" or not all(r["stages"][i]["state"] == "done" for r in reports):
            continue
        measured.append(_row("stages", "duration_s", f"{st['title']} duration",
                             [r["stages"][i]["duration_s"] for r in reports], "s"))
        if all(r["stages"][i]["peak_rss_bytes"] for r in reports):
            measured.append(_row("stages", "peak_rss_bytes", f"{st['title']} peak RSS",
                                 [r["stages"][i]["peak_rss_bytes"] for r in reports], "bytes"))
    # validation metrics present in every run
    if all(r.get("validation") for r in reports):
        names = [n for n in reports[0]["validation"]["checks"] if all(n in r["validation"]["checks"] for r in reports)]
        measured += [_row("validation", n, n, [r["validation"]["checks"][n]["value"] for r in reports])
                     for n in names]
    # KPIs present in every run; the source (device/simulated) is shown beside each value
    if all(r.get("kpis") for r in reports):
        by = [{k["name"]: k for k in r["kpis"]} for r in reports]
        for name, k in by[0].items():
            if all(name in b and b[name]["value"] is not None for b in by):
                measured.append(_row("kpis", name, k["label"], [b[name]["value"] for b in by], k["unit"],
                                     [b[name]["source"] for b in by]))
    if not measured:
        raise ReportError("These runs have nothing in common to compare: no stage completed in all of them, and "
                          "no validation metric or KPI is shared.",
                          "Compare runs that both got at least as far as the same stage (e.g. both validated, "
                          "or both chatted on a board).")
    runs = [{"run_id": r["run"]["run_id"], "model": r["model"]["id"], "status": r["run"]["status"],
             "simulated": bool((r.get("compile") or {}).get("simulated"))} for r in reports]
    mixed = len({k for r in reports for k in [(r.get("chat") or {}).get("source")] if k}) > 1
    return {"compare_version": 1, "generated": now_iso(), "runs": runs, "rows": rows + measured,
            "note": ("KPIs come from different sources (device and simulated): compare them with care."
                     if mixed else None)}


def _fmt(v: Any, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "bytes" and isinstance(v, (int, float)):
        from app.core.jobs import human_bytes

        return human_bytes(v)
    if isinstance(v, float):
        return f"{v:,.4g}"
    return html.escape(f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v))


def compare_html(c: dict[str, Any]) -> str:
    colors = {"better": "#1a7f37", "worse": "#cf222e", "changed": "#9a6700", "same": "#656d76"}
    head = "".join(f"<th>{html.escape(r['run_id'])}<br><small>{html.escape(str(r['model']))}"
                   f"{' · SIMULATED' if r['simulated'] else ''}</small></th>" for r in c["runs"])
    body = []
    section = None
    for row in c["rows"]:
        if row["section"] != section:
            section = row["section"]
            body.append(f"<tr><th colspan='{len(c['runs']) + 1}' style='background:#eaeef2'>{section}</th></tr>")
        cells = [f"<td>{_fmt(row['values'][0], row['unit'])}{_src(row, 0)}</td>"]
        for i, v in enumerate(row["values"][1:]):
            j = row["judgement"][i]
            d = row["deltas"][i]
            delta = f" <small>({d:+.1%})</small>" if d is not None else ""
            style = f" style='color:{colors[j]};font-weight:bold'" if j in ("better", "worse", "changed") else ""
            cells.append(f"<td{style}>{_fmt(v, row['unit'])}{delta}{_src(row, i + 1)}</td>")
        body.append(f"<tr><td>{html.escape(row['label'])}</td>{''.join(cells)}</tr>")
    note = f"<p><b>{html.escape(c['note'])}</b></p>" if c.get("note") else ""
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>HexStudio run comparison</title>"
            "<style>body{font-family:sans-serif;font-size:12px;margin:24px}table{border-collapse:collapse}"
            "td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left}</style></head><body>"
            f"<h1>Run comparison</h1><p>Baseline: the first run. Generated {html.escape(c['generated'])}. "
            "Only rows every run has are shown; deltas of 5 % or more are coloured (green better, red worse).</p>"
            f"{note}<table><tr><th></th>{head}</tr>{''.join(body)}</table></body></html>")


def _src(row: dict[str, Any], i: int) -> str:
    s = row.get("sources")
    return f" <small>[{html.escape(s[i])}]</small>" if s else ""
