"""Compare runs side by side (float vs W4A16, two models on one board, ...): like-for-like rows only,
the first run is the baseline, deltas beyond 5 % are highlighted as better or worse."""

from __future__ import annotations

from pathlib import Path
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
    # KPIs present in every run and measured the same way: a simulated figure is not set against a device one
    skipped: list[str] = []
    if all(r.get("kpis") for r in reports):
        by = [{k["name"]: k for k in r["kpis"]} for r in reports]
        sources = [(r.get("chat") or {}).get("source") for r in reports]
        if len(set(sources)) > 1:
            skipped.append("Chat KPIs: the runs measured them on different kinds of board ("
                           + ", ".join(f"{r['run']['run_id']}: {s}" for r, s in zip(reports, sources, strict=True))
                           + "); a simulated figure says nothing about a device one.")
        else:
            for name, k in by[0].items():
                if all(name in b and b[name]["value"] is not None for b in by):
                    measured.append(_row("kpis", name, k["label"], [b[name]["value"] for b in by], k["unit"],
                                         [b[name]["source"] for b in by]))
    elif any(r.get("kpis") for r in reports):
        skipped.append("Chat KPIs: not every run got as far as chatting on a board.")
    if not measured:
        raise ReportError("These runs have nothing in common to compare: no stage completed in all of them, and "
                          "no validation metric or KPI is shared.",
                          "Compare runs that both got at least as far as the same stage (e.g. both validated, "
                          "or both chatted on a board).")
    runs = [{"run_id": r["run"]["run_id"], "model": r["model"]["id"], "status": r["run"]["status"],
             "simulated": bool((r.get("compile") or {}).get("simulated")),
             "kpi_source": (r.get("chat") or {}).get("source")} for r in reports]
    return {"compare_version": 1, "generated": now_iso(), "runs": runs, "rows": rows + measured,
            "skipped": skipped}


def write_compare(c: dict[str, Any], fmt: str, out: Path) -> Path:
    """Write a comparison as json, html or pdf (atomically)."""
    import json

    from app.core.atomic import write_bytes_atomic, write_text_atomic
    from app.core.reports.render import to_pdf

    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        write_text_atomic(out, json.dumps(c, indent=2, ensure_ascii=False))
    elif fmt == "html":
        write_text_atomic(out, compare_html(c))
    elif fmt == "pdf":
        write_bytes_atomic(out, to_pdf(compare_html(c)))
    else:
        raise ReportError(f"Unknown comparison format '{fmt}'.", "Use html, pdf or json.")
    return out


def compare_html(c: dict[str, Any]) -> str:
    from app.core.reports.render import jinja_env

    return str(jinja_env().get_template("compare.html.j2").render(c=c, fmt=_fmt))


def _fmt(v: Any, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "bytes" and isinstance(v, (int, float)):
        from app.core.jobs import human_bytes

        return human_bytes(v)
    if isinstance(v, float):
        return f"{v:,.4g}"
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)
