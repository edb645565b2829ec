"""The stages, declared once. The CLI, the GUI wizard and reports all read this.

A stage is either a worker process (`worker="workers.<name>"`, heavy or
long work, run by the job runner) or an in-process async action
(`action="module:function"`, board/chat/report work that talks to the board
or reads the run). Both speak the worker protocol (workers/protocol.py).

`inputs` names the run settings a stage depends on; with the output digests of
its `needs`, they make the stage's input hash. A completed stage whose input
hash is unchanged is skipped on resume.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.core.manifest import RunManifest


def _gate_board(m: RunManifest) -> GateResult:
    st = m.stage("board")
    if st.state != "done":
        return GateResult(False, f"board has not completed ({st.state})")
    if st.metric_value("bundle_verified") is False:
        return GateResult(False, "the bundle on the board was not checked file by file (sha256 on the board)")
    resent = int(st.metric_value("push_resent_files", 0) or 0)
    return GateResult(True, "the doctor passes and every bundle file on the board has the local sha256"
                      + (f" ({resent} file(s) found wrong were sent again)" if resent else ""))


@dataclass(frozen=True)
class GateResult:
    passed: bool
    reason: str
    overridable: bool = False


def _gate_done(stage: str) -> Callable[[RunManifest], GateResult]:
    def gate(m: RunManifest) -> GateResult:
        st = m.stage(stage)
        if st.state == "done":
            return GateResult(True, "completed")
        return GateResult(False, f"{stage} has not completed ({st.state})")
    return gate


def _gate_preflight(m: RunManifest) -> GateResult:
    st = m.stage("preflight")
    if st.state != "done":
        return GateResult(False, f"preflight has not completed ({st.state})")
    failed = int(st.metric_value("checks_failed", 0) or 0)
    if failed:
        return GateResult(False, f"{failed} preflight check(s) failed: fix them or override", overridable=True)
    return GateResult(True, "no failing checks")


def _gate_validate(m: RunManifest) -> GateResult:
    st = m.stage("validate")
    if st.state != "done":
        return GateResult(False, f"validate has not completed ({st.state})")
    verdict = st.metric_value("verdict")
    if verdict == "pass":
        return GateResult(True, "both deployment graphs pass every threshold")
    return GateResult(False, f"validation verdict is {verdict!r}: the quantized deployment pair "
                             "does not match the float model closely enough", overridable=True)


def _gate_evaluate(m: RunManifest) -> GateResult:
    st = m.stage("evaluate")
    if st.state != "done":
        return GateResult(False, f"evaluate has not completed ({st.state})")
    matched, total = st.metric_value("parity_matched"), st.metric_value("parity_total")
    if isinstance(matched, int) and isinstance(total, int) and matched != total:
        return GateResult(False, f"greedy parity {matched}/{total}: the board's greedy continuation differs from the "
                                 "host quantized simulation's", overridable=True)
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
    gate: Callable[[RunManifest], GateResult]
    worker: str | None = None
    action: str | None = None
    version: int = 1
    heavy: bool = False
    produces: tuple[str, ...] = field(default_factory=tuple)

    @property
    def kind(self) -> str:
        return "worker" if self.worker else "action"


STAGES: tuple[Stage, ...] = (
    Stage(
        name="model", title="Model",
        summary="Resolve the model (built-in, Hugging Face id or local folder) and inspect it.",
        needs=(), inputs=("model", "revision", "context_length", "ar_n", "parts"),
        outputs=("model.json",),
        gate_text="The architecture is supported (dense Llama-family decoder) and its files are complete.",
        gate=_gate_done("model"), worker="workers.model",
    ),
    Stage(
        name="preflight", title="Preflight",
        summary="Check memory, disk, GPU, WSL and packages against this model's needs.",
        needs=("model",), inputs=("context_length", "calibration_samples", "calibration_seq_len", "workspace"),
        outputs=("preflight.json",),
        gate_text="No check fails (warnings are allowed).",
        gate=_gate_preflight, worker="workers.preflight",
    ),
    Stage(
        name="quantize", title="Quantize",
        summary="Export the prompt processor (AR-N) and token generator (AR-1) and quantize them W4A16 "
                "with AIMET-ONNX, one part at a time.",
        needs=("model",),
        inputs=("context_length", "ar_n", "parts", "calibration_samples", "calibration_seq_len",
                "calibration_text", "calibration_unit", "weight_bits", "activation_bits", "kv_bits", "device"),
        outputs=("quantize.json",),
        gate_text="Encodings and ONNX exist for every part of both graphs.",
        gate=_gate_done("quantize"), worker="workers.quantize", heavy=True,
    ),
    Stage(
        name="validate", title="Validate",
        summary="Run the prompt processor then the token generator as the board will, float vs quantized: "
                "top-1, KL, greedy agreement, perplexity, token-salad check.",
        needs=("model", "quantize"), inputs=("validation_text", "thresholds"),
        outputs=("validation.json",),
        gate_text="Every metric within its threshold (a failed gate can be overridden; the override is recorded).",
        gate=_gate_validate, worker="workers.validate", heavy=True,
    ),
    Stage(
        name="compile", title="Compile",
        summary="Compile both graphs per part on Qualcomm AI Hub, link them with shared weights, "
                "and write the Genie bundle (or the simulation bundle for the simulator board).",
        needs=("model", "quantize", "validate"),
        inputs=("board", "device", "qairt_version", "aihub_consent", "compile_target"),
        outputs=("bundle/genie_config.json", "bundle/bundle.json"),
        gate_text="A complete bundle with a sha256 for every file.",
        gate=_gate_done("compile"), worker="workers.compile",
    ),
    Stage(
        name="board", title="Board",
        summary="Connect to the board, run the doctor, install QAIRT if needed and push the bundle.",
        needs=("compile",), inputs=("board",),
        outputs=("board.json",),
        gate_text="The doctor passes and the bundle on the board matches the local one.",
        gate=_gate_board, action="app.core.device.stage:run_board_stage",
    ),
    Stage(
        name="chat", title="Chat",
        summary="Run Genie on the board: a deterministic benchmark prompt, then chat.",
        needs=("board",), inputs=("board", "benchmark_prompt", "sampler"),
        outputs=("chat.json",),
        gate_text="A reply was generated and its profile parsed.",
        gate=_gate_done("chat"), action="app.core.genie.stage:run_chat_stage",
    ),
    Stage(
        name="evaluate", title="Evaluate",
        summary="Run evaluation suites (tool calling, instruction following, perplexity, greedy parity) on the "
                "host float model, the host quantized simulation and the board, each score shown three ways.",
        needs=("model", "quantize", "board"),
        inputs=("board", "eval_suites", "eval_legs", "prompt_template", "runtime"),
        outputs=("evaluate.json",),
        gate_text="Every suite scored on each leg; the board's greedy continuation matches the host quantized "
                  "simulation token for token (N/N).",
        gate=_gate_evaluate, action="app.core.eval.stage:run_evaluate_stage",
    ),
    Stage(
        name="report", title="Report",
        summary="Write the run report (HTML, PDF, JSON).",
        needs=(), inputs=(),
        outputs=("report.html", "report.json"),
        gate_text="The report is written.",
        gate=_gate_done("report"), action="app.core.reports.stage:run_report_stage",
    ),
)

STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
_BY_NAME = {s.name: s for s in STAGES}


def get_stage(name: str) -> Stage:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; stages are: {', '.join(STAGE_NAMES)}") from None


def stages_until(name: str) -> tuple[Stage, ...]:
    idx = STAGE_NAMES.index(get_stage(name).name)
    return STAGES[: idx + 1]
