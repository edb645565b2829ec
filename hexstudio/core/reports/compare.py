"""Compare runs side by side (float vs W4A16, two models on one board, ...): like-for-like rows only, against
a baseline of your choice (the first run by default; it becomes the first column); a difference is marked
better or worse only beyond the noise (hexstudio.core.reports.noise: the measured spread, else a stated tolerance)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hexstudio.core.eval.compare import comparable_legs
from hexstudio.core.manifest import now_iso
from hexstudio.core.reports.bench import bench_rows
from hexstudio.core.reports.noise import (
    QUALITY_TOLERANCE,
    TIMING_TOLERANCE,
    bench_spreads,
    compare_csv,
    judge_row,
)
from hexstudio.core.reports.predicted import predicted_rows
from hexstudio.core.reports.render import ReportError

HIGHER_IS_BETTER = {
    "prompt_tok_s",
    "gen_tok_s",
    "predicted_decode_tok_s",
    "top1_agreement",
    "greedy_agreement",
    "eval_score",
}
LOWER_IS_BETTER = {
    "eval_perplexity",
    "init_ms",
    "ttft_ms",
    "predicted_ttft_ms",
    "gen_time_ms",
    "kl_divergence",
    "continuation_kl_divergence",
    "perplexity_ratio",
    "salad_score",
    "duration_s",
    "peak_rss_bytes",
}


def _row(
    section: str, name: str, label: str, values: list[Any], unit: str = "", sources: list[str] | None = None
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "section": section,
        "name": name,
        "label": label,
        "unit": unit,
        "values": values,
        "sources": sources,
        "deltas": [],
        "judgement": [],
    }
    base = values[0]
    for v in values[1:]:
        if (
            isinstance(base, (int, float))
            and isinstance(v, (int, float))
            and not isinstance(v, bool)
            and base
        ):
            row["deltas"].append(round((v - base) / abs(base), 4))
        else:
            row["deltas"].append(None)
    judge_row(row, None, (TIMING_TOLERANCE, QUALITY_TOLERANCE), HIGHER_IS_BETTER, LOWER_IS_BETTER)
    return row


BOARD_STAGES = ("board", "chat")
# stages whose time depends on the workstation and on the board or where the bundle was compiled: Compile (AI
# Hub, a local QNN compile or the simulation bundle) and Evaluate (its board leg runs on the board)
BOTH_STAGES = ("compile", "evaluate")
TRIVIAL_STAGES = ("model", "preflight")


def _board(r: dict[str, Any]) -> tuple[Any, ...]:
    """The board: its name and label, and its key (a hash of both taken before host names are hidden, which
    otherwise make two boards read alike: ssh://[user]@[host]:22)."""
    board = r.get("board") or {}
    return ("board", board.get("name"), board.get("label"), bool(board.get("simulated")), board.get("key"))


def _host(r: dict[str, Any]) -> tuple[Any, ...]:
    """The workstation by its hardware, not its host name (which a report may redact)."""
    env = r.get("environment") or {}
    gpus = tuple(str(g.get("name")) for g in env.get("gpus") or [] if isinstance(g, dict))
    return ("host", env.get("os"), env.get("cpu_count"), env.get("memory_bytes"), gpus)


def _machine(r: dict[str, Any], stage: str) -> tuple[Any, ...]:
    """What a stage's duration and memory depend on: the board for board stages, the workstation and the board
    (and for Compile where it compiled) for Compile and Evaluate, the workstation otherwise."""
    if stage in BOARD_STAGES:
        source = (r.get("chat") or {}).get("source") if stage == "chat" else None
        return (*_board(r), source)
    if stage in BOTH_STAGES:
        comp = r.get("compile") or {}
        target = (comp.get("target"), bool(comp.get("emulated"))) if stage == "compile" else None
        return ("both", _host(r), _board(r), target)
    return _host(r)


def _machine_text(m: tuple[Any, ...]) -> str:
    if m[0] == "board":
        name, label, key = m[1] or "?", m[2], m[4]
        where = (
            f"board {name}"
            + (f" ({label})" if label and label != name else "")
            + (f" #{key[:6]}" if key else "")
        )
        return where + (f", {m[5]}" if len(m) > 5 and m[5] else "")
    if m[0] == "both":
        target = m[3]
        how = "" if not target else f", compiled {target[0] or '?'}" + (" (EMULATED)" if target[1] else "")
        return f"{_machine_text(m[1])}; {_machine_text(m[2])}{how}"
    mem = f"{m[3] / 1024**3:.0f} GiB" if isinstance(m[3], int | float) else "? GiB"
    return f"{m[1] or '?'}, {m[2] or '?'} cores, {mem}" + (f", {', '.join(m[4])}" if m[4] else ", no GPU")


def compare_reports(
    reports: list[dict[str, Any]],
    baseline: int | str = 0,
    timing_tolerance: float = TIMING_TOLERANCE,
    quality_tolerance: float = QUALITY_TOLERANCE,
) -> dict[str, Any]:
    """Compare `reports` against the baseline (an index or a run id), with the stated tolerances."""
    if len(reports) < 2:
        raise ReportError("Compare needs at least two runs.", "Give two or more run ids.")
    ids = [r["run"]["run_id"] for r in reports]
    if isinstance(baseline, str):
        if baseline not in ids:
            raise ReportError(
                f"The baseline {baseline} is not one of the compared runs.", "Pick one of: " + ", ".join(ids)
            )
        baseline = ids.index(baseline)
    reports = [reports[baseline]] + [r for i, r in enumerate(reports) if i != baseline]
    rows: list[dict[str, Any]] = []
    # settings present in every run
    keys = [k for k in reports[0]["settings"] if all(k in r["settings"] for r in reports)]
    rows += [_row("settings", k, k, [r["settings"][k] for r in reports]) for k in keys]
    model_row = _row("settings", "model", "model", [r["model"]["id"] for r in reports])
    rows.insert(0, model_row)
    measured: list[dict[str, Any]] = []
    skipped: list[str] = []
    substantial = False  # a row beyond the model and preflight stages, which take seconds on any run
    # stages completed in every run, on the same kind of machine: a duration on an EVK is not set against one
    # on the simulator board, nor a quantize peak on one workstation against another's
    for i, st in enumerate(reports[0]["stages"]):
        if st["name"] == "report" or not all(r["stages"][i]["state"] == "done" for r in reports):
            continue
        machines = [_machine(r, st["name"]) for r in reports]
        if len(set(machines)) > 1:
            skipped.append(
                f"{st['title']} duration and memory: the runs ran this stage on different machines "
                f"({'; '.join(_machine_text(m) for m in machines)})."
            )
            continue
        if st["name"] not in TRIVIAL_STAGES:
            substantial = True
        measured.append(
            _row(
                "stages",
                "duration_s",
                f"{st['title']} duration",
                [r["stages"][i]["duration_s"] for r in reports],
                "s",
            )
        )
        if all(r["stages"][i]["peak_rss_bytes"] for r in reports):
            measured.append(
                _row(
                    "stages",
                    "peak_rss_bytes",
                    f"{st['title']} peak RSS",
                    [r["stages"][i]["peak_rss_bytes"] for r in reports],
                    "bytes",
                )
            )
    # validation metrics present in every run
    if all(r.get("validation") for r in reports):
        names = [
            n
            for n in reports[0]["validation"]["checks"]
            if all(n in r["validation"]["checks"] for r in reports)
        ]
        measured += [
            _row("validation", n, n, [r["validation"]["checks"][n]["value"] for r in reports]) for n in names
        ]
    # KPIs present in every run and measured the same way: a simulated figure is not set against a device one
    stale_chat = [r["run"]["run_id"] for r in reports if (r.get("chat") or {}).get("stale")]
    if stale_chat and all(r.get("kpis") for r in reports):
        skipped.append(
            f"Chat KPIs: out of date in {', '.join(stale_chat)} (the run changed after its Chat stage ran)."
        )
    elif all(r.get("kpis") for r in reports):
        by = [{k["name"]: k for k in r["kpis"]} for r in reports]
        sources = [(r.get("chat") or {}).get("source") for r in reports]
        if len(set(sources)) > 1:
            skipped.append(
                "Chat KPIs: the runs measured them on different kinds of board ("
                + ", ".join(f"{r['run']['run_id']}: {s}" for r, s in zip(reports, sources, strict=True))
                + "); a simulated figure says nothing about a device one."
            )
        else:
            for name, k in by[0].items():
                if all(name in b and b[name]["value"] is not None for b in by):
                    measured.append(
                        _row(
                            "kpis",
                            name,
                            k["label"],
                            [b[name]["value"] for b in by],
                            k["unit"],
                            [b[name]["source"] for b in by],
                        )
                    )
    elif any(r.get("kpis") for r in reports):
        skipped.append("Chat KPIs: not every run got as far as chatting on a board.")
    measured += bench_rows(reports, skipped, _row)
    predicted = predicted_rows(reports, skipped, _row)  # a section of their own, labeled predicted
    eval_plot = ""
    stale_eval = [r["run"]["run_id"] for r in reports if (r.get("evaluation") or {}).get("stale")]
    if stale_eval and all(r.get("evaluation") for r in reports):
        skipped.append(
            f"Evaluation: out of date in {', '.join(stale_eval)} (the run changed after its Evaluate stage ran)."
        )
    elif all(r.get("evaluation") for r in reports):  # suite scores per leg (hexstudio/core/eval/)
        ev_rows, bars = _evaluation_rows(reports, skipped)
        measured += ev_rows
        from hexstudio.core.eval.compare import bars_svg

        eval_plot = bars_svg(
            {
                "runs": [
                    {"model": r["model"]["id"], "source": r["evaluation"].get("source")} for r in reports
                ],
                "rows": bars,
            }
        )
    elif any(r.get("evaluation") for r in reports):
        skipped.append("Evaluation: not every run has run the Evaluate stage.")
    substantial = substantial or any(r["section"] != "stages" for r in measured) or bool(predicted)
    if not substantial:
        raise ReportError(
            "These runs have nothing in common to compare: no stage past Model and Preflight completed "
            "in all of them on the same kind of machine, and no validation metric or KPI is shared.",
            "Compare runs that both got at least as far as the same stage (e.g. both validated, "
            "or both chatted on a board).",
        )
    runs = [
        {
            "run_id": r["run"]["run_id"],
            "model": r["model"]["id"],
            "status": r["run"].get("status_word") or r["run"]["status"],
            # the board's numbers are simulated whatever compiled the bundle (collect.simulated_board)
            "simulated": bool(r.get("simulated_board") or (r.get("compile") or {}).get("simulated")),
            # compiled by the AI Hub emulator: its binaries are packages of the inputs, not device builds
            "emulated": bool((r.get("compile") or {}).get("emulated")),
            "kpi_source": (r.get("chat") or {}).get("source"),
        }
        for r in reports
    ]
    spreads = bench_spreads(reports)
    for row in rows + measured + predicted:  # judged against the chosen tolerances and measured spreads
        judge_row(
            row,
            spreads.get(row["label"]) if row["section"] == "bench" else None,
            (timing_tolerance, quality_tolerance),
            HIGHER_IS_BETTER,
            LOWER_IS_BETTER,
        )
    return {
        "compare_version": 1,
        "generated": now_iso(),
        "runs": runs,
        "rows": rows + measured + predicted,
        "skipped": skipped,
        "eval_plot": eval_plot,
        "baseline": runs[0]["run_id"],
        "tolerances": {"timing": timing_tolerance, "quality": quality_tolerance},
        "noise_rule": (
            f"Marked better or worse only beyond the noise: the measured run-to-run spread where "
            f"the runs measured one (2× their stdev), else a stated tolerance of "
            f"±{timing_tolerance * 100:g} % for timings and memory and ±{quality_tolerance * 100:g} % "
            "for quality figures."
        ),
    }


def _evaluation_rows(
    reports: list[dict[str, Any]], skipped: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Suite scores present in every run, leg by leg; the board leg only where every run's board is the same
    kind (simulated or device)."""
    evs = [r["evaluation"] for r in reports]
    by = [{t["suite"]: t for t in e.get("suites") or []} for e in evs]
    sources = [e.get("source") for e in evs]
    rows: list[dict[str, Any]] = []
    bars: list[dict[str, Any]] = []
    for name, t in by[0].items():
        if not all(name in b for b in by):
            continue
        ppl = t.get("scorer") == "perplexity"
        same, why = comparable_legs(name, [b[name] for b in by], every=True)
        skipped += [f"Evaluation {w}" for w in why]
        for leg in same:
            vals = [((b[name].get("legs") or {}).get(leg) or {}).get("value") for b in by]
            if any(v is None for v in vals):  # a leg one of the runs did not score
                continue
            if leg == "board" and len(set(sources)) > 1:
                skipped.append(
                    f"Evaluation {name} on the board: the runs used different kinds of board "
                    f"({', '.join(str(s) for s in sources)})."
                )
                continue
            rows.append(
                _row(
                    "evaluation",
                    "eval_perplexity" if ppl else "eval_score",
                    f"{name} · {leg}",
                    vals,
                    "ppl" if ppl else "",
                    [str(s) for s in sources] if leg == "board" else None,
                )
            )
            if not ppl:
                bars.append(
                    {"kind": "suite", "suite": name, "leg": leg, "lower_is_better": False, "values": vals}
                )
    return rows, bars


def write_compare(c: dict[str, Any], fmt: str, out: Path) -> Path:
    """Write a comparison as json, html, pdf or csv (atomically)."""
    import json

    from hexstudio.core.atomic import write_bytes_atomic, write_text_atomic
    from hexstudio.core.reports.render import to_pdf

    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        write_text_atomic(out, json.dumps(c, indent=2, ensure_ascii=False))
    elif fmt == "html":
        write_text_atomic(out, compare_html(c))
    elif fmt == "pdf":
        write_bytes_atomic(out, to_pdf(compare_html(c)))
    elif fmt == "csv":
        write_text_atomic(out, compare_csv(c))
    else:
        raise ReportError(f"Unknown comparison format '{fmt}'.", "Use html, pdf, json or csv.")
    return out


def compare_html(c: dict[str, Any]) -> str:
    from hexstudio.core.reports.render import jinja_env

    return str(jinja_env().get_template("compare.html.j2").render(c=c, fmt=_fmt))


def _fmt(v: Any, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "bytes" and isinstance(v, (int, float)):
        from hexstudio.core.jobs import human_bytes

        return human_bytes(v)
    if isinstance(v, float):
        # 4 significant digits for small figures (0.01234, 12.35); large ones in full (10,800.00 s, not 1.08e+04)
        return f"{v:,.2f}" if abs(v) >= 1000 else f"{v:.4g}"
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)
