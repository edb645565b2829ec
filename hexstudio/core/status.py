"""One status model for a stage of a run, and for the run as a whole.

Every face reads it: the studio's stage list and stage pages, the runs dashboard, Compare, the report and
`hexstudio runs show`. A stage that completed is not simply "done": it *passed* its gate, its *gate failed*,
or the gate failed and someone *overrode* it (who, when, why). The same word, symbol and colour go
everywhere, so a failed gate is never shown as a green tick on one face and "failed" on another.

Qt-free: the GUI draws its icons from `StatusKind.symbol` and `StatusKind.color`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexstudio.core.manifest import RunManifest
from hexstudio.core.stage_state import display_state
from hexstudio.core.stages import STAGES, Stage, get_stage
from hexstudio.shared.records import fields_dict


@dataclass(frozen=True)
class StatusKind:
    key: str  # one word in JSON
    word: str  # what a person reads (sidebar tooltip, page, dashboard, report, CLI)
    symbol: str  # one character: the CLI, the report and the studio's drawn icon show the same mark
    color: str  # hex colour (studio, report)
    explain: str  # a sentence for tooltips and the CLI's legend


KINDS: dict[str, StatusKind] = {
    k.key: k
    for k in (
        StatusKind("pending", "not run yet", "○", "#8a8f98", "This stage has not run yet."),
        StatusKind("running", "running", "◐", "#2f81f7", "This stage is working now."),
        StatusKind("passed", "passed", "✓", "#2da44e", "The stage completed and passed its gate."),
        StatusKind(
            "gate_failed",
            "gate failed",
            "!",
            "#d1242f",
            "The stage completed but its gate did not pass: later stages will not run unless it is overridden.",
        ),
        StatusKind(
            "overridden",
            "overridden",
            "⚑",
            "#bc4c00",
            "The stage's gate did not pass; a person overrode it (recorded in the run).",
        ),
        StatusKind("failed", "failed", "✗", "#d1242f", "The stage stopped with an error."),
        StatusKind(
            "cancelled", "cancelled", "⊘", "#8a8f98", "You cancelled the stage; run it again when ready."
        ),
        StatusKind(
            "interrupted",
            "interrupted",
            "↯",
            "#d1242f",
            "The studio or the machine stopped while the stage ran (crash, kill or reboot): resume it.",
        ),
        StatusKind(
            "stale",
            "stale",
            "↻",
            "#bf8700",
            "The stage completed, but its inputs changed since: it runs again on the next resume.",
        ),
    )
}

# what a stage that ended in each status lets the run do next
FINISHED_OK = ("passed", "overridden")


@dataclass(frozen=True)
class StageStatus:
    stage: str
    title: str
    kind: StatusKind
    detail: str  # the gate's reason, the override, or the failure message
    gate_reason: str | None = None
    override: dict[str, Any] | None = None  # {"by", "t", "reason"} when overridden
    overridable: bool = False

    @property
    def key(self) -> str:
        return self.kind.key

    @property
    def word(self) -> str:
        return self.kind.word

    @property
    def symbol(self) -> str:
        return self.kind.symbol

    @property
    def color(self) -> str:
        return self.kind.color

    def line(self) -> str:
        """`✓ passed`, `! gate failed`: the short form every face prints."""
        return f"{self.kind.symbol} {self.kind.word}"

    def as_json(self) -> dict[str, Any]:
        return {
            **fields_dict(self.kind, ("key", "word", "symbol")),
            **fields_dict(self, ("detail", "gate_reason", "override")),
        }


def override_record(m: RunManifest, name: str) -> dict[str, Any] | None:
    """The latest recorded override of `name`'s gate ({"by", "t", "reason"}), if the run's settings still ask
    for it (the pipeline continues past a failed gate only then)."""
    if name not in (m.settings.get("override_gates") or []):
        return None
    for ev in reversed(m.data.get("events", [])):
        if ev.get("kind") == "gate_override" and ev.get("stage") == name:
            return {"by": ev.get("by") or "unknown", "t": ev.get("t"), "reason": ev.get("message")}
    return None


def override_text(ov: dict[str, Any]) -> str:
    when = str(ov.get("t") or "")[:19].replace("T", " ")
    return f"overridden by {ov.get('by') or 'unknown'} on {when} UTC: {ov.get('reason')}"


def stage_status(m: RunManifest, name: str, stage: Stage | None = None, running: bool = False) -> StageStatus:
    """The status of one stage of `m`. `running` says the caller knows this stage is running right now (the
    studio's controller, before run.json says so)."""
    stage = stage or get_stage(name)
    if running:
        return StageStatus(name, stage.title, KINDS["running"], "working…")
    state = display_state(m, name, stage)
    st = m.stage(name)
    out = st.outcome or {}
    if state in ("failed", "cancelled", "interrupted"):
        return StageStatus(name, stage.title, KINDS[state], str(out.get("message") or KINDS[state].explain))
    if state in ("pending", "running"):
        return StageStatus(name, stage.title, KINDS[state], KINDS[state].explain)
    gate = stage.gate(m)
    if state == "stale":
        return StageStatus(name, stage.title, KINDS["stale"], KINDS["stale"].explain, gate_reason=gate.reason)
    if gate.passed:
        return StageStatus(name, stage.title, KINDS["passed"], gate.reason, gate_reason=gate.reason)
    ov = override_record(m, name) if gate.overridable else None
    if ov is not None:
        return StageStatus(
            name,
            stage.title,
            KINDS["overridden"],
            f"gate: {gate.reason} — {override_text(ov)}",
            gate_reason=gate.reason,
            override=ov,
            overridable=True,
        )
    return StageStatus(
        name,
        stage.title,
        KINDS["gate_failed"],
        f"gate: {gate.reason}",
        gate_reason=gate.reason,
        overridable=gate.overridable,
    )


def stage_statuses(m: RunManifest) -> list[StageStatus]:
    return [stage_status(m, s.name, s) for s in STAGES]


@dataclass(frozen=True)
class RunStatus:
    key: str  # complete | in_progress | running | gate_failed | failed | cancelled | interrupted
    word: str  # "complete", "gate failed at Evaluate", "5/9 stages passed"
    stage: str | None = None  # the stage that holds the run back, if any
    overridden: tuple[str, ...] = ()

    @property
    def report_status(self) -> str:
        """The report's three-valued run status (report.schema.json)."""
        if self.key == "complete":
            return "complete"
        return "in_progress" if self.key in ("in_progress", "running") else "failed"

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "word": self.word, "stage": self.stage, "overridden": list(self.overridden)}


def run_status(statuses: list[StageStatus]) -> RunStatus:
    """The run's status from its stages' (the dashboard, Compare, the report and the CLI all say this)."""
    overridden = tuple(s.stage for s in statuses if s.key == "overridden")
    if any(s.key == "running" for s in statuses):
        at = next(s for s in statuses if s.key == "running")
        return RunStatus("running", f"running {at.title}", at.stage, overridden)
    for s in statuses:
        if s.key in ("failed", "gate_failed", "cancelled", "interrupted"):
            return RunStatus(s.key, f"{s.word} at {s.title}", s.stage, overridden)
    counted = [s for s in statuses]
    ok = sum(s.key in FINISHED_OK for s in counted)
    if ok == len(counted):
        word = "complete" + (
            f" ({len(overridden)} gate{'s' if len(overridden) > 1 else ''} overridden)" if overridden else ""
        )
        return RunStatus("complete", word, None, overridden)
    stale = [s for s in statuses if s.key == "stale"]
    word = f"{ok}/{len(counted)} stages passed" + (f", {stale[0].title} stale" if stale else "")
    return RunStatus("in_progress", word, stale[0].stage if stale else None, overridden)


def legend() -> str:
    """The CLI's one-line legend of the symbols."""
    return "  ".join(f"{k.symbol} {k.word}" for k in KINDS.values())
