"""The aimet-onnx calls quantization makes, on every aimet-onnx HexStudio supports, chosen by what the
installed release offers (never by its version string):

| what                         | newer aimet-onnx (2.42)                          | older (2.26, the validated recipe)                     |
|------------------------------|--------------------------------------------------|--------------------------------------------------------|
| ORT session options          | QuantizationSimModel(session_options_kwargs=)    | sim._ort_session_options, then the session rebuilt     |
| LPBQ weights                 | set_param_type(sim, QSpec.lpbq(int4, 64, 4),     | set_lpbq_for_params(sim, 4, 64, op_types=, nodes_to_   |
|                              |   nodes_to_include=, strict=False)               |   exclude=) (strict=False only with op_types there)    |
| int8 lm_head                 | set_param_type(..., strict=False)                | set_param_type(...) (no strict)                        |
| 8-bit symmetric KV tensors   | each tensor's enabled quantizer: set_precision   | the same quantizer: set_bitwidth(8), int; symmetric    |
|                              |   (int8), use_symmetric_encodings                |   (qai-hub-models' LLM recipe sets both)               |
| LLM globals (Concat tie,     | quantsim.op_types_to_tie_qtzrs, _tie_qtzrs,      | the same globals (set only where present, restored     |
|   Slice/Constant unquantized)|   op_outputs_to_ignore (llm_quantsim_globals)    |   after the sim is built)                              |

Used by hexstudio/workers/quant/partwise.build_sim and by preflight's AIMET smoke test, so the smoke test fails
on a stack that cannot quantize.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any, Literal


def features() -> dict[str, bool]:
    """Which of the newer aimet-onnx APIs the installed release has."""
    import aimet_onnx
    from aimet_onnx import quantsim

    init = inspect.signature(aimet_onnx.QuantizationSimModel.__init__).parameters
    return {
        "qspec_lpbq": hasattr(aimet_onnx, "QSpec") and hasattr(getattr(aimet_onnx, "QSpec", None), "lpbq"),
        "session_options_kwargs": "session_options_kwargs" in init,
        "set_tensor_precision": hasattr(aimet_onnx.QuantizationSimModel, "set_tensor_precision"),
        "set_param_type_strict": "strict" in inspect.getsource(quantsim.set_param_type),
        "set_lpbq_for_params": hasattr(quantsim, "set_lpbq_for_params"),
    }


DEFAULT_TARGET_ARCH = "v73"  # the Dragonwing IQ-9075 EVK (QCS9075)

QuantsimConfigKind = Literal["aimet", "llm"]
QUANTSIM_CONFIGS: tuple[QuantsimConfigKind, ...] = ("aimet", "llm")


def _nearest(want: int, have: list[int]) -> int:
    """The newest of `have` not newer than `want`, else the oldest."""
    older = [v for v in sorted(have) if v <= want]
    return older[-1] if older else min(have)


def quantsim_config(dsp_arch: str | None, kind: QuantsimConfigKind = "aimet") -> str:
    """The QuantSim configuration for the target's Hexagon version (v73 for the IQ-9075), by `kind`:
    "aimet" (the default): AIMET's stock `htp_v<N>` alias, as Qualcomm's recipe configures QuantSim for the
    hardware it compiles for; "llm": HexStudio's LLM configuration (hexstudio/shared/data/quantsim/
    htp_llm_v<N>.json, after the one qai-hub-models quantizes its LLMs with: per-channel weights, data-movement
    outputs not quantized). Either the nearest older version shipped when there is none for that version.
    Build the sim with `make_sim(..., llm_globals=(kind == "llm"))`. docs/quantize.md has both measured."""
    arch = str(dsp_arch or DEFAULT_TARGET_ARCH).lower().lstrip("v")
    want = int(arch) if arch.isdigit() else int(DEFAULT_TARGET_ARCH[1:])
    if kind == "llm":
        from hexstudio.shared.data import quantsim_configs

        ours = quantsim_configs()
        return str(ours[_nearest(want, list(ours))])
    if kind != "aimet":
        raise ValueError(f"unknown quantsim configuration {kind!r} (one of {', '.join(QUANTSIM_CONFIGS)})")
    try:
        from aimet_onnx.common.quantsim_config.quantsim_config import _config_file_aliases as known
    except ImportError:
        known = {}
    have = [int(k[5:]) for k in known if k.startswith("htp_v") and k[5:].isdigit()]
    return f"htp_v{_nearest(want, have) if have else want}"


# the aimet-onnx module globals qai-hub-models sets before it builds an LLM's QuantSim
# (`_shared/llm/model.py`, LLM_AIMETOnnx.create_quantsim): tie the quantizers of Concat's inputs and output
# only, and quantize no output of Slice or Constant
LLM_TIE_OP_TYPES = ["Concat"]
LLM_OUTPUTS_TO_IGNORE = ("Slice", "Constant")


@contextlib.contextmanager
def llm_quantsim_globals() -> Iterator[list[str]]:
    """qai-hub-models' LLM globals on aimet_onnx.quantsim for the QuantizationSimModel built inside (they are read
    while it is built); each one only where this aimet-onnx has it, all restored on leaving so nothing leaks to
    the next sim. Yields the names of the globals it set."""
    from aimet_onnx import quantsim

    saved: dict[str, Any] = {}
    try:
        if isinstance(getattr(quantsim, "op_types_to_tie_qtzrs", None), list) and hasattr(
            quantsim, "_tie_qtzrs"
        ):
            saved["op_types_to_tie_qtzrs"] = quantsim.op_types_to_tie_qtzrs
            saved["_tie_qtzrs"] = quantsim._tie_qtzrs
            quantsim.op_types_to_tie_qtzrs = list(LLM_TIE_OP_TYPES)
            quantsim._tie_qtzrs = True
        ignore = getattr(quantsim, "op_outputs_to_ignore", None)
        if isinstance(ignore, list):
            saved["op_outputs_to_ignore"] = ignore
            quantsim.op_outputs_to_ignore = ignore + [t for t in LLM_OUTPUTS_TO_IGNORE if t not in ignore]
        yield list(saved)
    finally:
        for name, value in saved.items():
            setattr(quantsim, name, value)


def make_sim(
    model: Any,
    *,
    param_bits: int,
    activation_bits: int,
    path: str,
    providers: list[str],
    session_options: dict[str, Any],
    config_file: str = "htp_v73",
    llm_globals: bool = False,
) -> Any:
    """QuantizationSimModel(min_max, the target's HTP config: quantsim_config) with `session_options`
    (intra_op_num_threads, enable_cpu_mem_arena, ...) applied to its onnxruntime session; `llm_globals`:
    built under qai-hub-models' LLM globals (the "llm" configuration)."""
    from aimet_onnx import QuantizationSimModel
    from aimet_onnx.common.defs import qtype

    kwargs: dict[str, Any] = {
        "param_type": qtype.int(param_bits),
        "activation_type": qtype.int(activation_bits),
        "quant_scheme": "min_max",
        "config_file": config_file,
        "path": path,
        "providers": providers,
    }
    with llm_quantsim_globals() if llm_globals else contextlib.nullcontext():
        if features()["session_options_kwargs"]:
            return QuantizationSimModel(model, session_options_kwargs=session_options, **kwargs)
        sim = QuantizationSimModel(model, **kwargs)
        so = getattr(sim, "_ort_session_options", None)
        if so is not None and session_options:
            for k, v in session_options.items():
                setattr(so, k, v)
            sim._rebuild_session()
        return sim


def set_lpbq(sim: Any, nodes: set[str], bits: int, block_size: int = 64, scale_bits: int = 4) -> None:
    """Low-power blockwise weights (int `bits`, blocks of `block_size` input features, `scale_bits`-bit
    per-block scales: decompressed bitwidth bits + scale_bits) on the weights of `nodes`; a weight whose
    input features do not divide into blocks keeps its per-channel encoding."""
    from aimet_onnx import quantsim
    from aimet_onnx.common.defs import qtype

    if not nodes:
        return
    if features()["qspec_lpbq"]:
        from aimet_onnx import QSpec

        quantsim.set_param_type(
            sim,
            QSpec.lpbq(qtype.int(bits), block_size=block_size, scale_bits=scale_bits),
            nodes_to_include=set(nodes),
            strict=False,
        )
        return
    if scale_bits != bits:
        raise ValueError(f"this aimet-onnx's LPBQ has {bits}-bit block scales only (asked for {scale_bits})")
    # with nodes_to_include this release is strict (raises on a weight that does not divide into blocks):
    # the same nodes by op type minus the others, which is not strict
    types = {op.type for op in sim.connected_graph.ordered_ops if op.name in nodes}
    others = {op.name for op in sim.connected_graph.ordered_ops if op.type in types and op.name not in nodes}
    quantsim.set_lpbq_for_params(sim, bits, block_size, op_types=types, nodes_to_exclude=others)


def set_param_bits(sim: Any, nodes: set[str], bits: int) -> None:
    """Plain per-channel `bits`-bit weights on `nodes` (the lm_head)."""
    from aimet_onnx import quantsim
    from aimet_onnx.common.defs import qtype

    if not nodes:
        return
    if features()["set_param_type_strict"]:
        quantsim.set_param_type(sim, qtype.int(bits), nodes_to_include=set(nodes), strict=False)
    else:
        quantsim.set_param_type(sim, qtype.int(bits), nodes_to_include=set(nodes))


def set_tensor_bits(sim: Any, names: list[str], bits: int) -> list[str]:
    """`bits`-bit symmetric integer quantization for the tensors `names` (the KV cache's inputs and outputs): each
    tensor's enabled quantizer, or the closest enabled one upstream of it (as qai-hub-models' LLM recipe does,
    _set_tensor_to_8_bit_symmetric: the KV cache is exported 8-bit symmetric, so it is calibrated on that grid
    too, not on the activations' asymmetric one). Returns the names that have no enabled quantizer."""
    from aimet_onnx.common.defs import QuantizationDataType, qtype

    missing = []
    for name in names:
        try:
            q = sim._get_enabled_quantizer(name)
        except KeyError:  # not a tensor of this graph
            q = None
        if q is None:
            missing.append(name)
            continue
        if features()["set_tensor_precision"]:
            q.set_precision(qtype.int(bits))
        else:
            q.set_bitwidth(bits)
            q.data_type = QuantizationDataType.int
        q.use_symmetric_encodings = True
    return missing
