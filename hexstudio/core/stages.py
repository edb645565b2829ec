"""The stages, declared once. The CLI, the GUI wizard and reports all read this.

A stage is either a worker process (`worker="hexstudio.workers.<name>"`, heavy or
long work, run by the job runner) or an in-process async action
(`action="board"`: a name registered in hexstudio/core/stage_actions.py, board/chat/evaluate/report work
that talks to the board or reads the run; a stage from outside the studio may give "module:function"). Both speak the worker protocol (hexstudio/shared/protocol.py).

`inputs` names what a stage's results depend on: the run inputs it names here
(model, board) and the run settings that declare the stage in the registry of
run settings (hexstudio/shared/run_settings.py, `stages=`). With the output
digests of its `needs`, they make the stage's input hash. A completed stage
whose input hash is unchanged is skipped on resume.

`outputs` are the files (in the stage's artifact folder) a completed stage must
have written; every gate checks them first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hexstudio.shared.run_settings import read_by


class StageView(Protocol):
    """What a gate reads of one stage of a run (hexstudio.core.manifest.StageRecord is one)."""

    @property
    def state(self) -> str: ...

    @property
    def artifacts(self) -> list[dict[str, Any]]: ...

    def metric_value(self, name: str, default: Any = None) -> Any: ...


class RunView(Protocol):
    """What a gate reads of a run (hexstudio.core.manifest.RunManifest is one): the declarations stay below the
    manifest, which takes the stage names from here."""

    def stage(self, name: str) -> StageView: ...


def _verdict_board(m: RunView) -> GateResult:
    st = m.stage("board")
    if st.metric_value("bundle_verified") is False:
        return GateResult(False, "the bundle on the board was not checked file by file (sha256 on the board)")
    resent = int(st.metric_value("push_resent_files", 0) or 0)
    return GateResult(
        True,
        "the doctor passes and every bundle file on the board has the local sha256"
        + (f" ({resent} file(s) found wrong were sent again)" if resent else ""),
    )


@dataclass(frozen=True)
class GateResult:
    passed: bool
    reason: str
    overridable: bool = False


def _verdict_done(m: RunView) -> GateResult:
    return GateResult(True, "completed")


def _verdict_preflight(m: RunView) -> GateResult:
    st = m.stage("preflight")
    failed = int(st.metric_value("checks_failed", 0) or 0)
    if failed:
        return GateResult(
            False, f"{failed} preflight check(s) failed: fix them or override", overridable=True
        )
    return GateResult(True, "no failing checks")


def _verdict_validate(m: RunView) -> GateResult:
    st = m.stage("validate")
    verdict = st.metric_value("verdict")
    if verdict == "pass":
        unscored = st.metric_value("variants_not_scored")
        return GateResult(
            True,
            "both deployment graphs pass every threshold"
            + (
                f" ({unscored} more graph(s) of other context lengths or AR sizes, with the same weights and "
                "encodings, were not scored)"
                if isinstance(unscored, int) and unscored > 0
                else ""
            ),
        )
    return GateResult(
        False,
        f"validation verdict is {verdict!r}: the quantized deployment pair "
        "does not match the float model closely enough",
        overridable=True,
    )


def _verdict_evaluate(m: RunView) -> GateResult:
    st = m.stage("evaluate")
    matched, total = st.metric_value("parity_matched"), st.metric_value("parity_total")
    ref = st.metric_value("parity_reference")
    what = (
        "host HTP simulation's (Qualcomm's arithmetic: real Genie must match it token for token)"
        if ref == "htp"
        else "host quantized simulation's"
    )
    if ref == "empty":
        return GateResult(
            True,
            "every suite scored on each leg; greedy parity compared no tokens (every continuation ended at once "
            "on the board and on the host)",
        )
    if ref == "none":
        return GateResult(
            True,
            "every suite scored on each leg; greedy parity not measured (no host leg to compare the board "
            "with, or no tokenizer in the bundle)",
        )
    if ref == "sim-agreement" and isinstance(total, int):
        return GateResult(
            True,
            f"greedy parity {matched}/{total} against the onnxruntime simulation: an agreement "
            "figure (real Genie on the HTP simulator computes in HTP's arithmetic; the exact "
            "HTP leg could not run here)",
        )
    if isinstance(matched, int) and isinstance(total, int) and matched != total:
        return GateResult(
            False,
            f"greedy parity {matched}/{total}: the board's greedy continuation differs from the {what}",
            overridable=True,
        )
    parity = f"; greedy parity {matched}/{total}" if isinstance(total, int) else ""
    return GateResult(True, f"every suite scored on each leg{parity}")


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    summary: str
    needs: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    gate_text: str
    verdict: Callable[[RunView], GateResult]  # the stage's own test, once it completed with its outputs
    worker: str | None = None
    action: str | None = None  # hexstudio/core/stage_actions.py ACTIONS (or "module:function")
    version: int = 1
    heavy: bool = False
    # what later stages depend on, when the outputs' bytes change on every run without meaning anything new:
    # True takes the stage's summary (its action's return) and its input hash as its output digest, so an
    # unchanged re-run (the Board stage: the same bundle pushed to the same board again; board.json records
    # times and rates) does not make Chat and Evaluate stale
    digest_from_summary: bool = False
    # stages whose results it reads where they are, without needing them to have run (the Report): their states
    # and output digests are part of its input hash, so it is written again when any of them changed
    reads: tuple[str, ...] = ()
    # a name in hexstudio/core/stage_actions.py RECHECKS (or "module:function"), an async function(manifest) ->
    # str | None, asked before the stage is skipped as current:
    # None when what it produced is still in place, else why not, and the stage runs again. The Board stage's
    # output lives on the board, where anyone with the board's login can change it (issue 27: on --resume chat and
    # evaluate ran on a bundle tampered there): its sha256 are computed on the board again.
    recheck: str | None = None
    # a stage that measures the machine (Preflight): a failed gate that was not overridden is measured again on
    # the next run, though its inputs are the same: the person may have fixed what it found (added swap, freed
    # disk, raised WSL's memory)
    measure_again_after_failed_gate: bool = False

    @property
    def kind(self) -> str:
        return "worker" if self.worker else "action"

    def gate(self, m: RunView) -> GateResult:
        """What must be true to proceed: the stage completed, wrote every declared output, and passes its
        verdict (the pipeline, the studio's gate box and the report all ask this)."""
        st = m.stage(self.name)
        if st.state != "done":
            return GateResult(False, f"{self.name} has not completed ({st.state})")
        written = {str(a.get("path")) for a in st.artifacts}
        missing = [o for o in self.outputs if f"artifacts/{self.name}/{o}" not in written]
        if missing:
            return GateResult(
                False, f"{self.name} completed without writing {', '.join(missing)}: run the stage again"
            )
        return self.verdict(m)


STAGES: tuple[Stage, ...] = (
    Stage(
        name="model",
        title="Model",
        summary="Resolve the model (built-in, Hugging Face id or local folder) and inspect it.",
        needs=(),
        inputs=("model", *read_by("model")),
        outputs=("model.json",),
        gate_text="The architecture is supported (dense Llama-family decoder) and its files are complete.",
        verdict=_verdict_done,
        worker="hexstudio.workers.model",
    ),
    Stage(
        name="preflight",
        title="Preflight",
        summary="Check memory, disk, GPU, WSL and packages against this model's needs.",
        needs=("model",),
        inputs=(*read_by("preflight"), "workspace"),
        outputs=("preflight.json",),
        gate_text="No check fails (warnings are allowed).",
        verdict=_verdict_preflight,
        worker="hexstudio.workers.preflight",
        measure_again_after_failed_gate=True,
    ),
    Stage(
        name="quantize",
        title="Quantize",
        summary="Export the prompt processor (AR-N) and token generator (AR-1) and quantize them W4A16 "
        "with AIMET-ONNX, one part at a time.",
        needs=("model",),
        inputs=read_by("quantize"),
        outputs=("quantize.json",),
        gate_text="Encodings and ONNX exist for every part of both graphs.",
        verdict=_verdict_done,
        worker="hexstudio.workers.quantize",
        heavy=True,
    ),
    Stage(
        name="validate",
        title="Validate",
        summary="Run the prompt processor then the token generator as the board will, float vs quantized: "
        "top-1, KL, greedy agreement, perplexity, token-salad check.",
        needs=("model", "quantize"),
        inputs=read_by("validate"),
        outputs=("validation.json",),
        gate_text="Every metric within its threshold (a failed gate can be overridden; the override is recorded).",
        verdict=_verdict_validate,
        worker="hexstudio.workers.validate",
        heavy=True,
    ),
    Stage(
        name="compile",
        title="Compile",
        summary="Compile both graphs per part on Qualcomm AI Hub, link them with shared weights, "
        "and write the Genie bundle (or the simulation bundle for the simulator board).",
        needs=("model", "quantize", "validate"),
        inputs=("board", *read_by("compile")),
        outputs=("bundle/genie_config.json", "bundle/bundle.json"),
        gate_text="A complete bundle with a sha256 for every file.",
        verdict=_verdict_done,
        worker="hexstudio.workers.compile",
    ),
    Stage(
        name="board",
        title="Board",
        summary="Connect to the board, run the doctor, install QAIRT if needed and push the bundle.",
        needs=("compile",),
        inputs=("board", *read_by("board")),
        outputs=("board.json",),
        gate_text="The doctor passes and the bundle on the board matches the local one.",
        verdict=_verdict_board,
        action="board",
        digest_from_summary=True,
        recheck="board_still_in_place",
    ),
    Stage(
        name="chat",
        title="Chat",
        summary="Run Genie on the board: a deterministic benchmark prompt, then chat.",
        needs=("board",),
        inputs=("board", *read_by("chat")),
        outputs=("chat.json",),
        gate_text="A reply was generated and its profile parsed.",
        verdict=_verdict_done,
        action="chat",
    ),
    Stage(
        name="evaluate",
        title="Evaluate",
        summary="Run evaluation suites (tool calling, instruction following, perplexity, greedy parity) on the "
        "host float model, the host quantized simulation and the board, each score shown three ways.",
        needs=("model", "quantize", "board"),
        inputs=("board", *read_by("evaluate")),
        outputs=("evaluate.json",),
        gate_text="Every suite scored on each leg; the board's greedy continuation matches the host quantized "
        "simulation token for token (N/N).",
        verdict=_verdict_evaluate,
        action="evaluate",
    ),
    Stage(
        name="report",
        title="Report",
        summary="Write the run report (HTML, PDF, JSON).",
        needs=(),
        inputs=read_by("report"),
        reads=("model", "preflight", "quantize", "validate", "compile", "board", "chat", "evaluate"),
        outputs=("report.html", "report.json"),
        gate_text="The report is written.",
        verdict=_verdict_done,
        action="report",
    ),
)

STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
_BY_NAME = {s.name: s for s in STAGES}


def get_stage(name: str) -> Stage:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; stages are: {', '.join(STAGE_NAMES)}") from None
