"""Runs side by side: suite scores (each leg), tok/s, TTFT and init, for the Compare view and the report.

Rows are like-for-like only: a simulated board figure is never set beside a device one without saying so
(each value carries its source)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hexstudio.core.eval.scoring import LEGS
from hexstudio.core.manifest import ManifestError, RunManifest
from hexstudio.core.status import stage_status

KPI_ROWS = (
    ("gen_tok_s", "generation tok/s", "tok/s"),
    ("prompt_tok_s", "prompt tok/s", "tok/s"),
    ("ttft_ms", "TTFT", "ms"),
    ("init_ms", "init", "ms"),
)


def _read(p: Path) -> dict[str, Any] | None:
    try:
        doc: dict[str, Any] = json.loads(p.read_text(encoding="utf-8"))
        return doc
    except (OSError, ValueError):
        return None


def scores_not_current(m: RunManifest) -> str | None:
    """Why artifacts/evaluate/ does not hold the Evaluate stage's current result, in a sentence that says what to
    do; None when it does. A failed or stopped attempt leaves the earlier attempt's evaluate.json in place, and a
    run changed since (another bundle pushed, other settings) makes it describe the run as it was."""
    st = stage_status(m, "evaluate")
    key = st.kind.key
    if key in ("failed", "cancelled", "interrupted"):
        return (
            f"the last Evaluate attempt {st.kind.word} ({st.detail.rstrip('. ')}): these scores are an earlier "
            "attempt's. Run the Evaluate stage again for current ones."
        )
    if key in ("pending", "running"):
        return (
            "the Evaluate stage has not finished its latest attempt: these scores are an earlier attempt's."
        )
    if key == "stale":
        return (
            "the run changed after the Evaluate stage ran: these scores describe the run as it was. Run the "
            "Evaluate stage again for current ones."
        )
    return None


def _manifest(run_dir: Path) -> RunManifest | None:
    try:
        return RunManifest.load(run_dir)
    except (OSError, ValueError, ManifestError):
        return None


def run_summary(run_dir: Path) -> dict[str, Any] | None:
    """A run's evaluation and chat KPIs, or None when it has neither. An evaluation that is not the stage's current
    result (scores_not_current) is left out, as the run report leaves it out."""
    m = _manifest(run_dir)
    current = m is not None and scores_not_current(m) is None
    ev = _read(run_dir / "artifacts" / "evaluate" / "evaluate.json") if current else None
    ch = _read(run_dir / "artifacts" / "chat" / "chat.json")
    if ev is None and ch is None:
        return None
    run = _read(run_dir / "run.json") or {}
    model = str((run.get("inputs") or {}).get("model") or "?")
    return {
        "run_id": run_dir.name,
        "model": model,
        "board": (ev or ch or {}).get("board"),
        "source": (ev or {}).get("source") or (ch or {}).get("source") or "not stated",
        "suites": {
            t["suite"]: {
                "title": t.get("title"),
                "scorer": t.get("scorer"),
                "legs": t.get("legs") or {},
                "drops": t.get("drops") or {},
                "sha256": t.get("sha256"),
            }
            for t in (ev or {}).get("suites") or []
        },
        "kpis": (ch or {}).get("kpis") or {},
    }


def compare_runs(run_dirs: list[Path]) -> dict[str, Any]:
    return compare_summaries([s for s in (run_summary(Path(d)) for d in run_dirs) if s is not None])


def comparable_legs(
    suite: str, docs: list[dict[str, Any]], *, every: bool = False
) -> tuple[list[str], list[str]]:
    """(the legs on which runs' scores of `suite` stand side by side, why the others do not). `docs` are the runs'
    entries for the suite (sha256, legs: {leg: {value, cases, of}}). Only the same suite file, and leg by leg the
    same cases, compare: another suite version or another case set is not a better or worse model. Both the
    Compare view and the report's comparison ask this; `every`: a leg one of the runs did not score is left out
    without a word (the report sets only rows every run has)."""
    if len({d.get("sha256") for d in docs}) > 1:  # `hexstudio eval add --replace` between the runs
        return [], [
            f"{suite}: the runs scored different versions of the suite (its file changed between them)."
        ]
    legs: list[str] = []
    why: list[str] = []
    for leg in LEGS:
        scored = [x for x in ((d.get("legs") or {}).get(leg) for d in docs) if x]
        if not scored or (every and len(scored) < len(docs)):
            continue
        if len({(x.get("cases"), x.get("of")) for x in scored}) > 1:
            # e.g. the HTP-simulator board scores only the first parity cases: a different set, not a change
            cases = ", ".join(f"{x.get('cases')} of {x.get('of')}" for x in scored)
            why.append(f"{suite} · {leg}: the runs scored different cases ({cases}).")
            continue
        legs.append(leg)
    return legs, why


def compare_summaries(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows for runs' summaries (run_summary). A suite's scores stand side by side only where the runs scored
    the same suite file and, leg by leg, the same cases; the rest is said in `skipped` (as the run report's
    comparison does), since another suite version or another case set is not a better or worse model."""
    suites: list[str] = []
    for r in runs:
        suites += [s for s in r["suites"] if s not in suites]
    rows = []
    skipped: list[str] = []
    for s in suites:
        legs, why = comparable_legs(s, [r["suites"][s] for r in runs if s in r["suites"]])
        skipped += why
        for leg in legs:
            vals = [((r["suites"].get(s) or {}).get("legs") or {}).get(leg) for r in runs]
            rows.append(
                {
                    "kind": "suite",
                    "suite": s,
                    "leg": leg,
                    "label": f"{s} · {leg}",
                    "values": [v.get("value") if v else None for v in vals],
                    "texts": [v.get("text") if v else "—" for v in vals],
                    "lower_is_better": any(
                        (r["suites"].get(s) or {}).get("scorer") == "perplexity" for r in runs
                    ),
                }
            )
    for key, label, unit in KPI_ROWS:
        vals = [r["kpis"].get(key) for r in runs]
        if any(v is not None for v in vals):
            rows.append(
                {
                    "kind": "kpi",
                    "name": key,
                    "label": f"{label} ({unit})",
                    "values": vals,
                    "texts": ["—" if v is None else f"{v:,.4g}" for v in vals],
                    "lower_is_better": key in ("ttft_ms", "init_ms"),
                }
            )
    sources = {r["source"] for r in runs}
    notes = []
    if len(sources) > 1:
        notes.append(
            "These runs were measured on different kinds of board ("
            + ", ".join(f"{r['run_id']}: {r['source']}" for r in runs)
            + "): a simulated figure says nothing about a device one."
        )
    if skipped:
        notes.append("Not compared: " + " ".join(skipped))
    return {
        "runs": runs,
        "rows": rows,
        "skipped": skipped,
        "mixed_sources": len(sources) > 1,
        "note": " ".join(notes) or None,
    }


def bars_svg(c: dict[str, Any], *, leg: str = "board", width: int = 640, height: int = 240) -> str:
    """Grouped bars: each accuracy suite's score on `leg`, one bar per run (0..1)."""
    import html

    from hexstudio.core.reports.svg import PALETTE

    rows = [
        r
        for r in c["rows"]
        if r["kind"] == "suite"
        and r["leg"] == leg
        and not r["lower_is_better"]
        and any(v is not None for v in r["values"])
    ]
    if not rows or not c["runs"]:
        return ""
    left, top, bottom = 40, 26, 46
    w, h = width - left - 10, height - top - bottom
    group = w / len(rows)
    bw = group * 0.8 / len(c["runs"])
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="suite scores ({leg})" font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="15" font-weight="bold">Suite scores on the {html.escape(leg)} leg</text>',
    ]
    for i in range(5):
        y = top + h - h * i / 4
        out.append(
            f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{i / 4:g}</text>'
        )
    for gi, r in enumerate(rows):
        for ri, v in enumerate(r["values"]):
            if v is None:
                continue
            x = left + gi * group + group * 0.1 + ri * bw
            out.append(
                f'<rect x="{x:.1f}" y="{top + h - h * v:.1f}" width="{bw - 2:.1f}" height="{h * v:.1f}" '
                f'fill="{PALETTE[ri % len(PALETTE)]}"/>'
            )
        out.append(
            f'<text x="{left + gi * group + group / 2:.1f}" y="{top + h + 14}" text-anchor="middle">'
            f"{html.escape(r['suite'])}</text>"
        )
    for ri, run in enumerate(c["runs"]):
        out.append(
            f'<text x="{left + 150 * ri}" y="{height - 6}" fill="{PALETTE[ri % len(PALETTE)]}">'
            f"{html.escape(run['model'].split('/')[-1])} ({html.escape(str(run['source']))})</text>"
        )
    out.append("</svg>")
    return "".join(out)
