"""One encoding for every I/O tensor Genie shares between graphs (docs/genie.md, "Quantization Genie accepts").

Genie refuses a bundle in which a tensor name that appears in several graphs (the prompt processor and
the token generator of a part, the parts on both sides of a boundary, every part's mask and rotary
inputs) or a layer's `past_*_in` and `past_*_out` carry different scale/offset: "Non-identical
quantization parameters found for the same tensor" (Genie's nsp-model.cpp, validateModel). And where
Genie does not check, the board still depends on the encodings (nsp-model.cpp, attention-mask.cpp,
kvmanager.cpp):
- it writes a quantized attention_mask as all-ones (attend) and zero (masked) whatever the encoding,
  so the mask's encoding must put 0.0 at the top of its grid;
- it quantizes position_ids_sin with position_ids_cos's encoding, so the two must be equal;
- it clears a quantized KV cache with the mid value (0x80), so the KV encodings must be symmetric
  (offset -2^(bw-1)): then the empty cache reads as 0.0; qai-hub-models quantizes KV 8-bit symmetric
  and ties each `past_*_in` quantizer to its `past_*_out` (`_shared/llm/_utils.py`).

The prompt processor and the token generator of a part use ONE encodings file, as qai-hub-models does
(one calibration; the AR-128 and AR-1 graphs have identical tensor names). `tie_io_encodings` turns a
part's calibrated activation encodings into that contract, given the encodings the earlier parts fixed.

Encodings are AIMET's format 1.0.0: {"name", "bw", "dtype", "enc_type", "is_sym", "offset": [o],
"scale": [s]}, real = (q + offset) * scale.
"""

from __future__ import annotations

import copy
from typing import Any

ROPE = ("position_ids_cos", "position_ids_sin")
ENCODING_VERSION = "1.0.0"


def enc_range(a: dict[str, Any]) -> tuple[float, float]:
    scale, offset, bw = float(a["scale"][0]), round(float(a["offset"][0])), int(a["bw"])
    return scale * offset, scale * (offset + (1 << bw) - 1)


def encoding(name: str, lo: float, hi: float, bw: int, symmetric: bool = False) -> dict[str, Any]:
    """A per-tensor integer encoding of [lo, hi] on AIMET's grid."""
    levels = (1 << bw) - 1
    if symmetric:
        m = max(abs(lo), abs(hi), 1e-12)
        half = 1 << (bw - 1)
        scale, offset = m / (half - 1), -half
    else:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        scale = max(hi - lo, 1e-12) / levels
        offset = round(lo / scale)
    return {
        "name": name,
        "bw": bw,
        "dtype": "INT",
        "enc_type": "PER_TENSOR",
        "is_sym": symmetric,
        "offset": [int(offset)],
        "scale": [float(scale)],
    }


def mask_encoding(a: dict[str, Any]) -> dict[str, Any]:
    """The mask's encoding with q_max exactly 0.0 (Genie writes attend as all-ones) and q = 0 its lowest value."""
    lo, _ = enc_range(a)
    bw = int(a["bw"])
    levels = (1 << bw) - 1
    lo = min(lo, -1e-6)
    return {**encoding("attention_mask", lo, 0.0, bw), "offset": [-levels], "scale": [-lo / levels]}


# ops that only move data: their output carries their input's encoding (AIMET's config leaves most of them
# unquantized; qai-hub-models copies the encoding through them, `utils/aimet/encodings.py`)
MEMORY_OPS = (
    "Transpose",
    "Reshape",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Cast",
    "Slice",
    "Split",
    "Concat",
    "Identity",
    "Expand",
    "Tile",
    "Gather",
)


def propagate_memory_encodings(nodes: Any, acts: dict[str, dict[str, Any]]) -> list[str]:
    """Give the outputs of data-movement nodes that have no encoding their (first encoded) input's, in graph
    order, so every graph output (a KV output behind a Transpose) has one. Returns the tensors filled in."""
    filled = []
    for node in nodes:
        if node.op_type not in MEMORY_OPS:
            continue
        src = next((x for x in node.input if x in acts), None)
        if src is None:
            continue
        for o in node.output:
            if o and o not in acts:
                acts[o] = renamed(acts[src], o)
                filled.append(o)
    return filled


def renamed(a: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(a)
    out["name"] = name
    return out


def tie_io_encodings(
    acts: dict[str, dict[str, Any]],
    inputs: list[str],
    outputs: list[str],
    fixed: dict[str, dict[str, Any]],
    kv_bits: int,
) -> dict[str, Any]:
    """Apply the contract to one part's activation encodings `acts` (by tensor name, changed in place).
    `inputs`/`outputs`: the part's I/O names; `fixed`: encodings earlier parts fixed for tensors this part
    shares with them (mask, rope, the boundary it reads), updated with what this part fixes for the next.
    Returns a report: which tensors were set and how far each moved from its own calibration."""
    report: dict[str, Any] = {}

    def put(name: str, enc: dict[str, Any], why: str) -> None:
        before = acts.get(name)
        enc = renamed(enc, name)
        moved = None
        if before is not None:
            b_lo, b_hi = enc_range(before)
            a_lo, a_hi = enc_range(enc)
            span = max(b_hi - b_lo, 1e-12)
            moved = round(max(abs(a_lo - b_lo), abs(a_hi - b_hi)) / span, 6)
        acts[name] = enc
        report[name] = {"rule": why, "range_moved": moved}

    missing = [n for n in inputs + outputs if n not in acts and n not in ("input_ids",)]
    if missing:
        raise ValueError(
            f"no encoding for the graph I/O tensor(s) {', '.join(missing)}: Genie needs every I/O "
            "tensor quantized (AI Hub's --quantize_io)"
        )
    # KV: 8-bit symmetric from the output's calibrated range; the input takes the output's encoding
    for out in outputs:
        if out.startswith("past_") and out.endswith("_out"):
            lo, hi = enc_range(acts[out])
            enc = encoding(out, lo, hi, kv_bits, symmetric=True)
            put(out, enc, f"KV {kv_bits}-bit symmetric")
            inp = out[: -len("_out")] + "_in"
            if inp in inputs:
                put(inp, enc, f"tied to {out}")
    # mask and rope: one encoding in every graph; sin takes cos's (one range covering both)
    if "attention_mask" in inputs:
        put(
            "attention_mask",
            fixed.get("attention_mask") or mask_encoding(acts["attention_mask"]),
            "as part 1" if "attention_mask" in fixed else "0.0 at q_max (Genie writes attend as all-ones)",
        )
        fixed["attention_mask"] = acts["attention_mask"]
    if all(r in inputs for r in ROPE):
        if "position_ids_cos" in fixed:
            rope = fixed["position_ids_cos"]
        else:
            (c_lo, c_hi), (s_lo, s_hi) = enc_range(acts[ROPE[0]]), enc_range(acts[ROPE[1]])
            rope = encoding("position_ids_cos", min(c_lo, s_lo), max(c_hi, s_hi), int(acts[ROPE[0]]["bw"]))
        for r in ROPE:
            put(r, rope, "as part 1" if "position_ids_cos" in fixed else "cos and sin share one encoding")
        fixed["position_ids_cos"] = acts["position_ids_cos"]
    # the boundary this part reads: the encoding of the part that writes it
    for n in inputs:
        if n in fixed and n not in ("attention_mask", *ROPE):
            put(n, fixed[n], "as the part that writes it")
    for n in outputs:
        if n != "logits" and not n.startswith("past_"):
            fixed[n] = acts[n]
    return report
