"""The in-process stage actions, registered: `Stage.action` (hexstudio/core/stages.py) names one of `ACTIONS`, and
`Stage.recheck` one of `RECHECKS`.

Each entry imports its module when the stage runs, not when the pipeline loads (the board code brings paramiko
and the evaluation its suites), with a plain import statement, so the import graph and its contracts see every
action; an action module imports hexstudio/core/stage_api.py, never the pipeline. A stage from outside the
studio (a plug-in, a test) may still name its action "module:function" (`load`); a registered name always wins.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Awaitable, Callable
from typing import Any

from hexstudio.core.manifest import RunManifest
from hexstudio.core.stage_api import StageAction, StageContext

Recheck = Callable[[RunManifest], Awaitable[str | None]]


async def _board(ctx: StageContext) -> dict[str, Any] | None:
    from hexstudio.core.device.stage import run_board_stage

    return await run_board_stage(ctx)


async def _chat(ctx: StageContext) -> dict[str, Any] | None:
    from hexstudio.core.genie.stage import run_chat_stage

    return await run_chat_stage(ctx)


async def _evaluate(ctx: StageContext) -> dict[str, Any] | None:
    from hexstudio.core.eval.stage import run_evaluate_stage

    return await run_evaluate_stage(ctx)


async def _report(ctx: StageContext) -> dict[str, Any] | None:
    from hexstudio.core.reports.stage import run_report_stage

    return await run_report_stage(ctx)


async def _board_still_in_place(m: RunManifest) -> str | None:
    from hexstudio.core.device.stage import board_still_in_place

    return await board_still_in_place(m)


ACTIONS: dict[str, StageAction] = {
    "board": _board,
    "chat": _chat,
    "evaluate": _evaluate,
    "report": _report,
}
RECHECKS: dict[str, Recheck] = {"board_still_in_place": _board_still_in_place}


def load(name: str, registry: dict[str, Any]) -> Any:
    """A registered action or recheck; "module:function" for one from outside the studio. ImportError or
    AttributeError when it cannot be loaded (the pipeline says so); LookupError when no such name exists."""
    if name in registry:
        return registry[name]
    if ":" not in name:
        raise LookupError(f"no stage action or recheck named {name!r}")
    mod_name, func_name = name.split(":", 1)
    if importlib.util.find_spec(mod_name) is None:
        raise LookupError(f"no module {mod_name}")
    return getattr(importlib.import_module(mod_name), func_name)
