"""The Report stage: writes report.html and report.json into the run (PDF on demand: `hexstudio report`)."""

from __future__ import annotations

import asyncio
from typing import Any

from hexstudio.core.reports.collect import build_report
from hexstudio.core.reports.render import ReportError, validate_report, write
from hexstudio.core.stage_api import StageContext, StageError


def _redact_hosts() -> bool:
    """Host and user names stay out of reports unless the studio setting include_host_in_reports says so."""
    from hexstudio.core.settings import Settings

    try:
        return not bool(Settings.load().data.get("include_host_in_reports", False))
    except Exception:  # an unreadable settings file: err on the side of privacy
        return True


async def run_report_stage(ctx: StageContext) -> dict[str, Any]:
    em = ctx.emitter
    em.progress(0.1, "collecting the run")
    hosts = await asyncio.to_thread(_redact_hosts)
    rep = await asyncio.to_thread(build_report, ctx.manifest.run_dir, redact_hosts=hosts)
    try:
        validate_report(rep)
    except ReportError as exc:  # a HexStudio bug: said, and the report is still written for the person
        em.warning(exc.message, exc.hint, code="report_schema")
    try:
        em.progress(0.5, "writing report.html and report.json")
        await asyncio.to_thread(write, rep, "json", ctx.out_dir / "report.json")
        await asyncio.to_thread(write, rep, "html", ctx.out_dir / "report.html")
    except ReportError as exc:
        raise StageError("report_failed", exc.message, exc.hint) from None
    em.artifact("report.json", kind="json", role="report")
    em.artifact("report.html", kind="html", role="report")
    em.metric("run_status", rep["run"]["status"])
    em.progress(1.0, f"report written (run {rep['run']['status']})")
    return {"status": rep["run"]["status"]}
