"""Runs whose stages ended a given way (gate passed, gate failed, cancelled...), written into run.json the way
the pipeline writes them, without running the workers: the status model and its faces read only run.json
and the artifacts' sizes, so these runs are what a real run leaves behind, made in milliseconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hexstudio.core.manifest import RunManifest, now_iso
from hexstudio.core.runs import Workspace
from hexstudio.core.stage_state import hash_tree, input_hash, output_digest
from hexstudio.core.stages import get_stage


def finish_stage(
    m: RunManifest, name: str, metrics: dict[str, Any] | None = None, duration_s: float = 1.5
) -> None:
    """Mark `name` done with its declared outputs written and `metrics`; store its gate as the pipeline does."""
    stage = get_stage(name)
    out = m.run_dir / "artifacts" / name
    for rel in stage.outputs:
        p = out / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}", encoding="utf-8")  # an empty document: the report leaves its section out
    st = m.stage(name).data
    st.update(
        {
            "state": "done",
            "attempts": int(st.get("attempts") or 0) + 1,
            "started": now_iso(),
            "ended": now_iso(),
            "duration_s": duration_s,
            "outcome": {"kind": "ok"},
            "metrics": {k: {"value": v} for k, v in (metrics or {}).items()},
        }
    )
    st["artifacts"] = hash_tree(out)
    st["output_digest"] = output_digest(st["artifacts"])
    st["input_hash"] = input_hash(m, stage)
    gate = stage.gate(m)
    st["gate"] = {"passed": gate.passed, "reason": gate.reason, "override": None}
    m.save()


def rewrite_output(m: RunManifest, name: str, rel: str, text: str) -> None:
    """Write `name`'s output `rel` as a stage attempt writes it: recorded with the stage (its size and sha256), so
    the stage stays current rather than stale."""
    out = m.run_dir / "artifacts" / name
    (out / rel).write_text(text, encoding="utf-8")
    st = m.stage(name).data
    st["artifacts"] = hash_tree(out)
    st["output_digest"] = output_digest(st["artifacts"])
    m.save()


def end_stage(m: RunManifest, name: str, kind: str, message: str) -> None:
    """A stage that ended without completing: kind is failed, cancelled or interrupted."""
    st = m.stage(name).data
    st.update(
        {
            "state": kind,
            "attempts": int(st.get("attempts") or 0) + 1,
            "started": now_iso(),
            "ended": now_iso(),
            "outcome": {"kind": kind, "message": message, "hint": None},
        }
    )
    m.save()


PASSING: dict[str, dict[str, Any]] = {
    "model": {},
    "preflight": {"checks_failed": 0},
    "quantize": {},
    "validate": {"verdict": "pass"},
    "compile": {},
    "board": {"bundle_verified": True},
    "chat": {},
    "evaluate": {"parity_matched": 256, "parity_total": 256},
    "report": {},
}


def gate_failed_run(workspace_root: Path, failing: str = "evaluate") -> RunManifest:
    """A run whose stages up to `failing` completed; `failing`'s gate did not pass (greedy parity 248/256 for
    Evaluate, as in issue 32; a failed validation verdict for Validate)."""
    ws = Workspace(workspace_root)
    m = ws.create_run("builtin:tiny-llama", "sim", {})
    bad: dict[str, dict[str, Any]] = {
        "evaluate": {"parity_matched": 248, "parity_total": 256},
        "validate": {"verdict": "fail"},
        "preflight": {"checks_failed": 2},
    }
    for name in PASSING:
        if name == "report":
            break
        finish_stage(m, name, bad[failing] if name == failing else PASSING[name])
        if name == failing:
            break
    return m


def skip_board_recheck(monkeypatch: Any) -> None:
    """For the synthetic runs above, which have stage records but no pushed bundle: the Board stage's recheck before
    a resumed run skips it (tested on real pushes in tests/board/test_resume_board.py) would find nothing to check
    and run the stage again instead of stopping at the failed gate the test is about."""

    async def in_place(_m: Any) -> None:
        return None

    monkeypatch.setattr("hexstudio.core.device.stage.board_still_in_place", in_place)
