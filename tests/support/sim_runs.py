"""A validated run taken through compile (simulation bundle), shared by the compile, genie, GUI and
report tests (docs/CONTRACTS.md §6)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path


def copy_run(run_dir: Path, workspace_root: Path) -> Path:
    dest = Path(workspace_root) / "runs" / Path(run_dir).name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(run_dir, dest)
    return dest


def build_compiled_sim_run(validated_run_dir: Path, workspace_root: Path) -> Path:
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace

    dest = copy_run(validated_run_dir, workspace_root)
    m = Workspace(workspace_root).open_run(dest.name)
    res = asyncio.run(Pipeline(m).run(only="compile"))
    if not res.ok:
        raise RuntimeError(f"could not prepare the compiled run: {res.message} ({res.hint})")
    return dest
