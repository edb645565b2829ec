"""Render a report (from collect.build_report) as JSON, self-contained HTML (inline SVG plots) or PDF
(WeasyPrint from the same HTML). Files are written atomically."""

from __future__ import annotations

import itertools
import json
from importlib import resources
from pathlib import Path
from typing import Any

from hexstudio.core.atomic import write_bytes_atomic, write_text_atomic
from hexstudio.core.reports.bench import bench_plots
from hexstudio.core.reports.svg import Series, line_chart
from hexstudio.shared.errors import ActionableError

TEMPLATES = resources.files(__package__).joinpath("templates")  # package data (importlib.resources)
FORMATS = ("html", "pdf", "json")
GIB = 1024**3


class ReportError(ActionableError):
    """A report cannot be rendered or written: message and hint."""


def _bytes(v: Any) -> str:
    if not isinstance(v, (int, float)) or v <= 0:
        return "—"
    from hexstudio.core.jobs import human_bytes

    return human_bytes(v)


def _num(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.2f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _clock(v: Any) -> str:
    """2026-11-22T15:49:49.214+00:00 -> 15:49:49 (the date is in the report's header)."""
    if not isinstance(v, str) or "T" not in v:
        return "—"
    return v.split("T", 1)[1][:8]


def _when(v: Any) -> str:
    """2026-11-22T15:49:49.214+00:00 -> 2026-11-22 15:49:49 UTC."""
    if not isinstance(v, str) or "T" not in v:
        return "—"
    day, clock = v.split("T", 1)
    return f"{day} {clock[:8]} UTC" if v.endswith(("+00:00", "Z")) else f"{day} {clock[:8]}"


def jinja_env() -> Any:
    import jinja2

    def template_source(name: str) -> str | None:
        node = TEMPLATES.joinpath(name)
        return node.read_text(encoding="utf-8") if node.is_file() else None

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(template_source), autoescape=True, undefined=jinja2.ChainableUndefined
    )
    env.filters["bytes"] = _bytes
    env.filters["num"] = _num
    env.filters["clock"] = _clock
    env.filters["when"] = _when
    return env


def attempts(rows: list[list[float]]) -> list[list[list[float]]]:
    """The samples of each attempt of a stage: a stage run again appends to the same resources log, so a
    new attempt starts where the time goes back or jumps by far more than the sampling interval."""
    if not rows:
        return []
    steps = sorted(b[0] - a[0] for a, b in itertools.pairwise(rows) if b[0] > a[0])
    typical = steps[len(steps) // 2] if steps else 1.0
    gap = max(10.0, 20 * typical)
    out: list[list[list[float]]] = [[rows[0]]]
    for prev, row in itertools.pairwise(rows):
        if row[0] < prev[0] or row[0] - prev[0] > gap:
            out.append([])
        out[-1].append(row)
    return out


def plots(r: dict[str, Any]) -> dict[str, Any]:
    """One memory chart per stage: its last attempt only (earlier attempts are named, never joined to it
    by a line), with the preflight estimate as a dashed line where the report has it."""
    res = []
    estimates = r.get("estimates") or (r.get("model") or {}).get("estimates") or {}
    for stage, rows in (r.get("series", {}).get("resources") or {}).items():
        runs = attempts(rows)
        last = runs[-1] if runs else []
        if len(last) < 4:  # a stage over in a second has no curve worth drawing
            continue
        t0 = last[0][0]
        series = [Series("RSS (GiB)", [(row[0] - t0, row[1] / GIB) for row in last])]
        if any(row[2] for row in last):
            series.append(Series("VRAM (GiB)", [(row[0] - t0, row[2] / GIB) for row in last]))
        est = estimates.get(f"{stage}_peak_rss_bytes")
        hline = (
            (float(est) / GIB, f"preflight estimate {float(est) / GIB:.2f} GiB")
            if isinstance(est, (int, float)) and est > 0
            else None
        )
        which = f", attempt {len(runs)} of {len(runs)}" if len(runs) > 1 else ""
        svg = line_chart(
            series,
            title=f"{stage}: memory of the worker's process tree{which}",
            x_label="seconds",
            y_label="GiB",
            hline=hline,
        )
        if svg:
            res.append(svg)
    tr = r.get("series", {}).get("token_rate") or []
    source = (r.get("chat") or {}).get("source", "")
    unit = r.get("series", {}).get("token_rate_unit") or "tokens/s"  # chunks/s when tokens were not counted
    what = "Token rate" if unit == "tokens/s" else "Output rate (reads of the runner output, not tokens)"
    token = (
        line_chart(
            [Series(f"{unit} ({source})", [(p[0], p[1]) for p in tr])],
            title=f"{what} during the benchmark reply ({source})",
            x_label="seconds since the prompt",
            y_label=unit,
        )
        if tr
        else ""
    )
    return {"resources": res, "token_rate": token, "bench": bench_plots(r.get("bench"))}


def recipe_names(r: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for row in r.get("environment", {}).get("recipes") or []:
        for k in row:
            if k not in ("package", "installed") and k not in names:
                names.append(k)
    return names


def to_html(r: dict[str, Any]) -> str:
    return str(
        jinja_env().get_template("report.html.j2").render(r=r, plots=plots(r), recipe_names=recipe_names(r))
    )


def to_pdf(html: str) -> bytes:
    try:
        import weasyprint
    except (ImportError, OSError) as exc:  # OSError: WeasyPrint is there but its Pango library is not
        raise ReportError(
            f"PDF export needs WeasyPrint, which cannot be imported ({exc}).",
            "Install it (pip install weasyprint; on Debian/Ubuntu also libpango-1.0-0), or export "
            "HTML and print it to PDF from a browser.",
        ) from None
    pdf: bytes = weasyprint.HTML(string=html).write_pdf()
    return pdf


def write(r: dict[str, Any], fmt: str, out: Path) -> Path:
    if fmt not in FORMATS:
        raise ReportError(f"Unknown report format '{fmt}'.", f"Use one of: {', '.join(FORMATS)}.")
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        write_text_atomic(out, json.dumps(r, indent=2, ensure_ascii=False))
    elif fmt == "html":
        write_text_atomic(out, to_html(r))
    else:
        write_bytes_atomic(out, to_pdf(to_html(r)))
    return out


SCHEMA = resources.files("hexstudio.core").joinpath("schemas", "report.schema.json")  # package data


def validate_report(r: dict[str, Any]) -> None:
    """Check a report against hexstudio/core/schemas/report.schema.json (JSON Schema draft 2020-12)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))
    err = jsonschema.exceptions.best_match(validator.iter_errors(r))
    if err is not None:
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        raise ReportError(
            f"The report does not match its schema at {where}: {err.message}",
            "This is a HexStudio bug, not a problem with your run: the report is written all the same; please "
            "report the bug with the run's run.json.",
        )
