"""Genie's load-time model checks, from the graphs' I/O specs, with Genie's own message texts.

A graph spec is what metadata.yaml holds per component and what a simulated context binary carries:
{"inputs": {name: {"shape": [...], "dtype": "uint16", "quantization_parameters": {"scale", "offset"}}},
 "outputs": {...}} (docs/CONTRACTS.md; quantization in AIMET's convention real = (q + offset) * scale).

What Genie's HTP engine does when it loads the context binaries (QAIRT 2.40 / Genie 1.13,
`examples/Genie/Genie/src/qualla/engines/qnn-htp/nsp-model.cpp`, `nsp-graph.cpp`, `qnn-htp.cpp`,
`qnn-api/qnn-utils.cpp`; public copy github:kyungraekim/qnn; docs/genie.md):

- each graph's variant (AR, CL) from its I/O shapes (input_ids, attention_mask, KV), else from the name;
- graphs of one variant become splits in the lexicographic order of their names;
- context.size larger than the largest CL: `Failure to initialize model. Config specifies
  context->size=<n>, but loaded max-CL=<m>`;
- validateModel: input_ids in the first split and logits in the last (`Tensor not found`), the
  shapes of input_ids, attention_mask, position_ids_cos/sin and the KV tensors, and identical
  quantization (scale, offset) of every same-named tensor except logits across all graphs
  (`Non-identical quantization parameters found for the same tensor`); all of these are printed as a
  block and the load throws `Error validating model. Please check your I/O. Error validating HTP models`;
- then the fixed-name tensors are looked up (`Tensor not found: <name>`, then
  `Error : Could not find I/O tensors in loaded graphs. `).

Genie does not check, but a real board then computes garbage silently (HexStudio findings, `genie`
False): a split input no earlier split writes (Genie links parts by tensor name only), splits whose
lexicographic order is not their part order, position_ids_sin quantized differently from cos (Genie
quantizes both with cos's encoding), a KV encoding that is not symmetric (Genie clears the cache with
the mid value 0x80/0x8000, which must mean 0.0), a quantized attention_mask whose largest code is
not 0.0 (Genie writes "attend" as all-ones), a KV in/out pair Genie's own check misses.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

VALIDATION_FAILED = "Error validating model. Please check your I/O. Error validating HTP models"
TENSORS_FAILED = "Error : Could not find I/O tensors in loaded graphs. "
NON_IDENTICAL = "Non-identical quantization parameters found for the same tensor"
BLOCK_HEAD = '[ERROR] "Model Validation Errors found"'
BLOCK_TAIL = (
    "[ERROR] \"Note: Dimensions denoted by '*' are ignored (i.e. no comparison)\"",
    '[ERROR] "Check model i/o specs (set dump-specs=true in config) for debugging"',
)
STANDARD_INPUTS = (
    "input_ids",
    "attention_mask",
    "position_ids_cos",
    "position_ids_sin",
    "position_ids",
    "cache_index",
    "inputs_embeds",
    "valid_token_mask",
)
_NUM = re.compile(r"\d+")
_AR_RE = re.compile(r"(?:ar|AR)_?(\d+)")
_CL_RE = re.compile(r"(?:cl|CL)_?(\d+)")
_PART_RE = re.compile(r"_(\d+)_of_(\d+)$")
_QMAX = {"uint8": 255, "uint16": 65535, "uint32": 4294967295, "int8": 127, "int16": 32767}
_BITS = {
    "uint8": 8,
    "int8": 8,
    "uint16": 16,
    "int16": 16,
    "float16": 16,
    "uint32": 32,
    "int32": 32,
    "float32": 32,
}


@dataclass
class ModelIssue:
    code: str  # tensor_not_found, shape, non_identical_quant, context_size, variant, split_chain, ...
    graph: str
    tensor: str
    message: str  # Genie's text (genie=True) or a HexStudio sentence
    genie: bool  # True: Genie itself refuses the load with this message
    stage: str = (
        "validate"  # Genie's step: "load" (before validateModel), "validate", "tensors"; "" for HexStudio
    )


def _kv(name: str, prefix: str = "past_") -> str | None:
    """'key'/'value' for a KV cache tensor name (prefix, key/value, _in/_out), else None."""
    if not name.startswith(prefix) or not name.endswith(("_in", "_out")):
        return None
    return "key" if "key" in name else "value" if "value" in name else None


def _dims(shape: list[int]) -> tuple[int, int, int]:
    """(height, width, channel) as Genie reads a shape (rank left-padded to 4)."""
    s = [1] * (4 - len(shape)) + [int(x) for x in shape[-4:]]
    h = s[0] if s[0] != 1 and s[1] == 1 else s[1]
    return h, s[2], s[3]


def _shape(t: dict[str, Any] | None) -> list[int] | None:
    if not isinstance(t, dict) or not isinstance(t.get("shape"), list):
        return None
    return [int(x) for x in t["shape"]]


def _count(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def _quant(t: dict[str, Any] | None) -> tuple[float, int]:
    q = (t or {}).get("quantization_parameters") or {}
    scale, offset = q.get("scale", 0.0), q.get("offset", 0)
    scale = scale[0] if isinstance(scale, list) and scale else scale
    offset = offset[0] if isinstance(offset, list) and offset else offset
    return float(scale or 0.0), int(offset or 0)


def _has_quant(t: dict[str, Any] | None) -> bool:
    return bool((t or {}).get("quantization_parameters"))


def _bitwidth(t: dict[str, Any] | None) -> str:
    return str(_BITS[str(t.get("dtype"))] // 8) if t and str(t.get("dtype")) in _BITS else "*"


def _fmt(dims: tuple[Any, Any, Any]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + "]"


def variant_of(name: str, spec: dict[str, Any], prefix: str = "past_") -> tuple[int, int]:
    """(AR, CL) of a graph as Genie determines it (nsp-graph.cpp): shapes first, then the name. CL -1
    when nothing says (Genie then uses it for every CL). Raises ValueError as Genie refuses."""
    ins, outs = spec.get("inputs") or {}, spec.get("outputs") or {}
    ar = None
    if _shape(ins.get("input_ids")) is not None:
        ar = _count(_shape(ins["input_ids"]) or [])
    elif (m := _shape(ins.get("attention_mask"))) is not None and m:
        ar = _count(m) // max(m)
    else:
        for k, t in outs.items():
            if _kv(k, prefix) == "key" and (s := _shape(t)):
                ar = s[-1]
                break
        if ar is None and (s := _shape(outs.get("logits"))):
            ar = s[-2] if len(s) >= 2 else 1
        if ar is None and (m2 := _AR_RE.search(name)):
            ar = int(m2.group(1))
    if ar is None:
        raise ValueError(f"Unexpected model. Couldn't determine required input tokens {name}")
    cl = None
    if (m := _shape(ins.get("attention_mask"))) is not None and m:
        cl = m[-1]
    else:
        kin = next((_shape(t) for k, t in ins.items() if _kv(k, prefix) == "key" and _shape(t)), None)
        kout = next((_shape(t) for k, t in outs.items() if _kv(k, prefix) == "key" and _shape(t)), None)
        if kin and kout:
            cl = kin[-1] + kout[-1]
        elif m2 := _CL_RE.search(name):
            cl = int(m2.group(1))
        else:
            nums = [int(x) for x in _NUM.findall(name)]
            cl = max(nums) if nums and max(nums) > 501 else -1
    return ar, cl


def splits(
    graphs: dict[str, dict[str, Any]], prefix: str = "past_"
) -> tuple[dict[tuple[int, int], list[str]], list[ModelIssue]]:
    """{(AR, CL): [graph names in split order]} as Genie forms them (lexicographic order of names)."""
    out: dict[tuple[int, int], list[str]] = {}
    issues: list[ModelIssue] = []
    for name in sorted(graphs):
        try:
            out.setdefault(variant_of(name, graphs[name], prefix), []).append(name)
        except ValueError as exc:
            issues.append(ModelIssue("variant", name, "", str(exc), True, "load"))
    return out, issues


def model_issues(
    graphs: dict[str, dict[str, Any]],
    context_size: int | None,
    *,
    kv_dim: int | None = None,
    rope_dim: int | None = None,
    prefix: str = "past_",
    positional: str = "rope",
) -> list[ModelIssue]:
    """Every Genie load-time refusal and every HexStudio finding for these graphs, Genie's first.
    `positional`: the config's positional-encoding type (rope: Genie feeds position_ids_cos/sin;
    absolute/alibi: position_ids)."""
    variants, issues = splits(graphs, prefix)
    if not variants:
        return issues
    max_cl = max(cl for _, cl in variants)
    if context_size is not None and max_cl > 0 and context_size > max_cl:
        issues.append(
            ModelIssue(
                "context_size",
                "",
                "",
                "Failure to initialize model. Config specifies "
                f"context->size={context_size}, but loaded max-CL={max_cl}",
                True,
                "load",
            )
        )
    issues += _validate(graphs, variants, kv_dim, rope_dim, prefix)
    issues += _tensors(graphs, variants, positional)
    caught = {i.tensor for i in issues if i.code == "non_identical_quant"}
    issues += [
        i for i in _hexstudio(graphs, variants, prefix) if not (i.code == "kv_untied" and i.tensor in caught)
    ]
    return issues


def _validate(
    graphs: dict[str, dict[str, Any]],
    variants: dict[tuple[int, int], list[str]],
    kv_dim: int | None,
    rope_dim: int | None,
    prefix: str,
) -> list[ModelIssue]:
    out: list[ModelIssue] = []

    def shape_error(g: str, t: str, want: tuple[Any, Any, Any], spec: dict[str, Any]) -> None:
        got = _dims(_shape(spec) or [])
        if any(w != "*" and w != h for w, h in zip(want, got, strict=True)):
            out.append(
                ModelIssue(
                    "shape",
                    g,
                    t,
                    f"Expected {_fmt(want)} bitwidth=*. Found {_fmt(got)} bitwidth={_bitwidth(spec)}",
                    True,
                )
            )

    for (ar, cl), names in variants.items():
        first, last = graphs[names[0]], graphs[names[-1]]
        ids = (first.get("inputs") or {}).get("input_ids")
        if ids is None:
            out.append(ModelIssue("tensor_not_found", names[0], "input_ids", "Tensor not found", True))
        elif _shape(ids) is not None and _count(_shape(ids) or []) != ar:
            out.append(ModelIssue("shape", names[0], "input_ids", "Wrong input shape", True))
        logits = (last.get("outputs") or {}).get("logits")
        if logits is None:
            out.append(ModelIssue("tensor_not_found", names[-1], "logits", "Tensor not found", True))
        elif (s := _shape(logits)) is not None and s and _count(s) not in (max(s), max(s) * ar):
            out.append(ModelIssue("shape", names[-1], "logits", "Wrong logits shape", True))
        for g in names:
            ins, outs = graphs[g].get("inputs") or {}, graphs[g].get("outputs") or {}
            if _shape(ins.get("attention_mask")) is not None:
                shape_error("ShapeError", "attention_mask", (1, ar, cl), ins["attention_mask"])
            for t in ("position_ids_cos", "position_ids_sin"):
                if _shape(ins.get(t)) is not None:
                    shape_error("ShapeError", t, (1, ar, rope_dim if rope_dim else "*"), ins[t])
            for t, spec in sorted({**ins, **outs}.items()):
                kind = _kv(t, prefix)
                if kind is None or _shape(spec) is None:
                    continue
                hd = kv_dim if kv_dim else "*"
                if t.endswith("_in"):
                    last_dim = (_shape(spec) or [0])[-1 if kind == "key" else -2]
                    if last_dim not in (cl, cl - ar):
                        out.append(
                            ModelIssue(
                                "shape",
                                g,
                                t,
                                "Could not determine whether KV$ uses Scatter or "
                                f"Concat. KV$ has input dimension {last_dim}.Expected CL={cl} or "
                                f"CL - AR-n={cl - ar}",
                                True,
                                "load",
                            )
                        )
                        continue
                    past = last_dim
                    want = ("*", hd, past) if kind == "key" else ("*", past, hd)
                else:
                    want = ("*", hd, ar) if kind == "key" else ("*", ar, hd)
                shape_error("ShapeError", t, want, spec)
            for t in (x for x in ins if _kv(x, prefix) == "key"):
                v = t.replace("key", "value", 1)
                if v not in ins:
                    layer = (_NUM.findall(t) or ["0"])[0]
                    out.append(
                        ModelIssue(
                            "kv_pair",
                            g,
                            t,
                            f"Error in layer {layer} head 0. Found Key {t} but no Value {v}",
                            True,
                            "load",
                        )
                    )
    out += _identical_quantization(graphs, variants, prefix)
    return out


def _identical_quantization(
    graphs: dict[str, dict[str, Any]], variants: dict[tuple[int, int], list[str]], prefix: str
) -> list[ModelIssue]:
    """validateModel's check 4, quirks included: a KV `_in` is compared with what is stored under its
    `_out` name, and stored under its own name when first seen (so in/out of a layer are compared only
    across two graphs holding that layer)."""
    seen: dict[str, tuple[float, int]] = {}
    out = []
    for names in variants.values():
        for g in names:
            spec = graphs[g]
            for side in ("inputs", "outputs"):
                for t in sorted(spec.get(side) or {}):
                    if t == "logits":
                        continue
                    q = _quant(spec[side][t])
                    look = t[:-3] + "_out" if _kv(t, prefix) and t.endswith("_in") else t
                    if look in seen:
                        if seen[look] != q:
                            out.append(ModelIssue("non_identical_quant", g, t, NON_IDENTICAL, True))
                    else:
                        seen[t] = q
    return out


def _tensors(
    graphs: dict[str, dict[str, Any]], variants: dict[tuple[int, int], list[str]], positional: str = "rope"
) -> list[ModelIssue]:
    """initializeTensorPointers: the fixed names must exist in some split of each variant."""
    out = []
    wanted = (
        ("attention_mask", "position_ids_sin", "position_ids_cos")
        if positional == "rope"
        else ("attention_mask", "position_ids")
    )
    for names in variants.values():
        have = {t for g in names for t in (graphs[g].get("inputs") or {})}
        for t in wanted:
            if t not in have:
                out.append(
                    ModelIssue("tensor_not_found", names[0], t, f"Tensor not found: {t}", True, "tensors")
                )
        if "input_ids" not in have and "inputs_embeds" not in have:
            out.append(
                ModelIssue(
                    "tensor_not_found", names[0], "input_ids", "Tensor not found: input_ids", True, "tensors"
                )
            )
    seen, uniq = set(), []
    for i in out:
        if i.tensor not in seen:
            seen.add(i.tensor)
            uniq.append(i)
    return uniq


def _hexstudio(
    graphs: dict[str, dict[str, Any]], variants: dict[tuple[int, int], list[str]], prefix: str
) -> list[ModelIssue]:
    out: list[ModelIssue] = []
    for (ar, cl), names in variants.items():
        parts = [_PART_RE.search(n) for n in names]
        if all(parts):
            order = [int(m.group(1)) for m in parts if m]
            totals = {int(m.group(2)) for m in parts if m}
            if order != sorted(order):
                out.append(
                    ModelIssue(
                        "split_order",
                        names[0],
                        "",
                        f"The AR-{ar} CL-{cl} graphs run in the "
                        f"lexicographic order of their names ({', '.join(names)}), which is not their "
                        "part order: zero-pad the part number (e.g. _02_of_12).",
                        False,
                        "",
                    )
                )
            if len(totals) > 1 or (totals and max(totals) != len(names)):
                out.append(
                    ModelIssue(
                        "split_count",
                        names[0],
                        "",
                        f"The AR-{ar} CL-{cl} variant has {len(names)} "
                        f"graph(s) named as parts of {sorted(totals)}: a part is missing or extra.",
                        False,
                        "",
                    )
                )
        for k in range(1, len(names)):
            prev_out = set(graphs[names[k - 1]].get("outputs") or {})
            for t in sorted(graphs[names[k]].get("inputs") or {}):
                if t in STANDARD_INPUTS or _kv(t, prefix):
                    continue
                if t not in prev_out:
                    cands = sorted(x for x in prev_out if x != "logits" and not _kv(x, prefix))
                    out.append(
                        ModelIssue(
                            "split_chain",
                            names[k],
                            t,
                            f"Input {t} of {names[k]} is no output of "
                            f"{names[k - 1]} (which writes {', '.join(cands) or 'no hidden state'}): "
                            "Genie links parts by tensor name only, so this input is never written "
                            "and the model computes on garbage.",
                            False,
                            "",
                        )
                    )
        for g in names:
            ins, outs = graphs[g].get("inputs") or {}, graphs[g].get("outputs") or {}
            cos, sin = ins.get("position_ids_cos"), ins.get("position_ids_sin")
            if _has_quant(cos) and _has_quant(sin) and _quant(cos) != _quant(sin):
                out.append(
                    ModelIssue(
                        "cos_sin_quant",
                        g,
                        "position_ids_sin",
                        f"position_ids_sin is quantized "
                        f"{_qtext(sin)}, position_ids_cos {_qtext(cos)}: Genie quantizes both tables "
                        "with cos's encoding, so sin is fed wrong values.",
                        False,
                        "",
                    )
                )
            mask = ins.get("attention_mask")
            dt = str((mask or {}).get("dtype", ""))
            if _has_quant(mask) and dt in _QMAX and dt.startswith("uint"):
                scale, offset = _quant(mask)
                top = (_QMAX[dt] + offset) * scale
                if abs(top) > abs(scale) / 2:
                    out.append(
                        ModelIssue(
                            "mask_quant",
                            g,
                            "attention_mask",
                            f"attention_mask ({dt}, "
                            f"{_qtext(mask)}) decodes its largest code to {top:.6g}, not 0.0: Genie "
                            "writes 'attend' as all-ones, so every attended position is biased.",
                            False,
                            "",
                        )
                    )
            for t, spec in sorted({**ins, **outs}.items()):
                dt = str((spec or {}).get("dtype", ""))
                if _kv(t, prefix) and _has_quant(spec) and dt in ("uint8", "uint16"):
                    mid = -(1 << (_BITS[dt] - 1))
                    if _quant(spec)[1] != mid:
                        out.append(
                            ModelIssue(
                                "kv_asymmetric",
                                g,
                                t,
                                f"{t} ({dt}, {_qtext(spec)}) is not "
                                f"symmetric (offset {mid}): Genie clears the KV cache with the mid "
                                "code, which then is not 0.0.",
                                False,
                                "",
                            )
                        )
            for t in (x for x in ins if _kv(x, prefix)):
                o = t[:-3] + "_out"
                if o in outs and _has_quant(ins[t]) and _quant(ins[t]) != _quant(outs[o]):
                    out.append(
                        ModelIssue(
                            "kv_untied",
                            g,
                            t,
                            f"{t} {_qtext(ins[t])} and {o} {_qtext(outs[o])} are "
                            "quantized differently: Genie copies the new entries byte for byte from "
                            "the output into the cache input, so the cache is read with the wrong "
                            "scale (Genie checks this only across two graphs).",
                            False,
                            "",
                        )
                    )
    return out


def _qtext(t: dict[str, Any] | None) -> str:
    s, o = _quant(t)
    return f"scale {s:.6g} offset {o}"


def genie_lines(issues: list[ModelIssue]) -> list[str]:
    """What Genie prints and throws for these issues, in its order; [] when Genie loads the model. Only the
    first failing step is reported (Genie stops there)."""
    g = [i for i in issues if i.genie]
    if not g:
        return []
    load = [i for i in g if i.stage == "load"]
    if load:
        return [load[0].message]
    val = [i for i in g if i.stage == "validate"]
    if val:
        return [
            BLOCK_HEAD,
            *(f'[ERROR] "{i.graph} : {i.tensor} - {i.message}"' for i in val),
            *BLOCK_TAIL,
            VALIDATION_FAILED,
        ]
    return [*(i.message for i in g if i.stage == "tensors"), TENSORS_FAILED]
