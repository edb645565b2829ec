"""metadata.yaml of a Genie bundle, as qai-hub-models writes it (its `LLMMetadata`: quic/ai-hub-models,
qai_hub_models/models/_shared/llm/model.py and export.py; docs/compile.md):

    components:
      prompt_1_of_2:                 # f"{prompt|token}_{i}_of_{n}", from the graph name
        inputs:
          input_ids: {shape: [1, 128], dtype: int32}
          attention_mask: {shape: [1, 1, 128, 512], dtype: uint16,
                           quantization_parameters: {scale: 1.52e-05, offset: -65535}}
        outputs: {...the same form...}
      token_1_of_2: {...}
    precision: w4a16
    runtime: genie

Each tensor's dtype is what AI Hub compiles it to with `--quantize_io`: `input_ids` stays int32, a
tensor with an encoding takes its bit width (the KV cache 8-bit -> uint8, the other activations
16-bit -> uint16), a tensor without one follows the name rule (KV uint8, anything else uint16, the
`--quantize_full_type w8a16` fallback). Scale and offset come from the graph's AIMET encodings
(format 1.0.0: lists per tensor, per-tensor values at [0]; the legacy dict form is read too), with
AIMET's convention real = (q + offset) * scale.

A graph spec ({"inputs": {...}, "outputs": {...}}) is also what the simulated context binary carries
per graph, and what the Genie-model checks (hexstudio/shared/bundle/genie_model.py) take per graph name.

Pure Python + yaml: onnx is imported inside `graph_spec` only, when shapes must be read from the ONNX.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from hexstudio.shared.errors import ActionableError

RUNTIME = "genie"
_COMPONENT_RE = re.compile(r"^(prompt|token)_ar(\d+)_cl(\d+)_(\d+_of_\d+)$")
_KV_RE = re.compile(r"^past_(key|value)_\d+_(in|out)$")
INTEGER_INPUTS = {"input_ids": "int32"}


class MetadataError(ActionableError, ValueError):
    """A graph or an encodings file cannot be described; the message says which and why."""


def component_name(graph_name: str) -> str:
    """The metadata.yaml component of a graph: "prompt_ar128_cl512_1_of_2" -> "prompt_1_of_2" (the part
    number keeps the graph name's zero padding)."""
    m = _COMPONENT_RE.match(graph_name)
    if m is None:
        raise MetadataError(
            f"Graph name '{graph_name}' is not of the form {{prompt|token}}_ar<AR>_cl<CL>_<i>_of_<n>."
        )
    return f"{m.group(1)}_{m.group(4)}"


def variant_component(graph_name: str, main_ar: int, main_cl: int) -> str:
    """The component of a graph in a bundle with several ARs or CLs: component_name, then `_ar<AR>` for a prompt
    processor of another AR (ar_sizes) and `_cl<CL>` for another context length ("prompt_1_of_2_ar4_cl128");
    the main ones keep qai-hub-models' names."""
    comp = component_name(graph_name)
    m = _COMPONENT_RE.match(graph_name)
    assert m is not None  # component_name checked it
    return comp + variant_suffix(m.group(1), int(m.group(2)), int(m.group(3)), main_ar, main_cl)


def variant_suffix(kind: str, ar: int, cl: int, main_ar: int, main_cl: int) -> str:
    """The one rule naming a graph variant (components, AI Hub jobs, a local bundle's binaries): `_ar<AR>` for a
    prompt processor ("prompt") of another AR than the main one, `_cl<CL>` for another context length."""
    return ("" if kind == "token" or ar == main_ar else f"_ar{ar}") + ("" if cl == main_cl else f"_cl{cl}")


def main_variant(graph_names: list[str]) -> tuple[int, int]:
    """(AR, CL) of the bundle's main graphs: the largest prompt AR and the largest CL among `graph_names`."""
    found = [m for n in graph_names if (m := _COMPONENT_RE.match(n))]
    ars = [int(m.group(2)) for m in found if m.group(1) == "prompt"]
    return max(ars, default=0), max((int(m.group(3)) for m in found), default=0)


def is_kv(name: str) -> bool:
    return _KV_RE.match(name) is not None


# -- encodings ---------------------------------------------------------------------------------
def read_encodings(path: Path) -> dict[str, dict[str, Any]]:
    """Activation encodings by tensor name, each {"bw", "dtype", "scale", "offset"} (per-tensor
    values; None when absent). Reads AIMET format 1.0.0 (a list of named entries) and the legacy
    form (a dict of name -> [entry])."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise MetadataError(f"Cannot read the encodings {path}: {exc}") from None
    acts = doc.get("activation_encodings") if isinstance(doc, dict) else None
    out: dict[str, dict[str, Any]] = {}
    if isinstance(acts, list):  # 1.0.0
        for e in acts:
            if isinstance(e, dict) and "name" in e:
                out[str(e["name"])] = _norm_entry(e)
    elif isinstance(acts, dict):  # legacy: name -> [entry, ...]
        for name, es in acts.items():
            e = es[0] if isinstance(es, list) and es else es
            if isinstance(e, dict):
                out[str(name)] = _norm_entry(e)
    elif acts is not None:
        raise MetadataError(f"{path}: activation_encodings is neither a list (format 1.0.0) nor a dict.")
    return out


def _first(v: Any) -> Any:
    return v[0] if isinstance(v, list) and v else (None if isinstance(v, list) else v)


def _norm_entry(e: dict[str, Any]) -> dict[str, Any]:
    scale, offset = _first(e.get("scale")), _first(e.get("offset"))
    return {
        "bw": int(e["bw"])
        if e.get("bw") is not None
        else (int(e["bitwidth"]) if e.get("bitwidth") else None),
        "dtype": str(e.get("dtype") or "INT").upper(),
        "scale": float(scale) if scale is not None else None,
        "offset": round(float(offset)) if offset is not None else None,
    }


def tensor_spec(
    name: str, shape: list[int], enc: dict[str, Any] | None, integer_dtype: str | None = None
) -> dict[str, Any]:
    """One tensor's metadata entry: shape, compiled dtype and (when quantized) its scale and offset. An
    integer tensor (`input_ids`, or `integer_dtype` from the graph) is not quantized: it keeps its type."""
    spec: dict[str, Any] = {"shape": [int(d) for d in shape]}
    if name in INTEGER_INPUTS or integer_dtype:
        spec["dtype"] = INTEGER_INPUTS.get(name) or integer_dtype
        return spec
    if enc is not None and enc["dtype"] == "FLOAT":
        spec["dtype"] = f"float{enc['bw'] or 16}"
        return spec
    bw = enc["bw"] if enc is not None and enc["bw"] in (8, 16) else (8 if is_kv(name) else 16)
    spec["dtype"] = f"uint{bw}"
    if enc is not None and enc["scale"] is not None and enc["offset"] is not None:
        spec["quantization_parameters"] = {"scale": enc["scale"], "offset": enc["offset"]}
    return spec


# -- shapes --------------------------------------------------------------------------------------
def _io_from_entry(io: Any) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """graph_entry["io"]: {"inputs": {name: shape | {"shape": [...]}}, "outputs": {...}} or the same with
    lists of {"name", "shape"}."""

    def side(v: Any) -> dict[str, list[int]]:
        if isinstance(v, dict):
            return {str(k): list(s["shape"] if isinstance(s, dict) else s) for k, s in v.items()}
        if isinstance(v, list):
            return {str(t["name"]): list(t["shape"]) for t in v}
        raise MetadataError(f"graph io entry {v!r} is neither a dict nor a list")

    return side(io.get("inputs") or {}), side(io.get("outputs") or {})


def onnx_io_types(onnx_path: Path) -> tuple[dict[str, list[int]], dict[str, list[int]], dict[str, str]]:
    """(inputs, outputs) name -> static shape, in the ONNX's order (the weights are not loaded), plus the
    integer I/O tensors' types (name -> "int32", "int64", ...)."""
    import onnx

    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:  # onnx raises its own DecodeError / ValidationError types
        raise MetadataError(f"Cannot read the graph {onnx_path}: {exc}") from None

    def shape(vi: Any) -> list[int]:
        dims = []
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                raise MetadataError(
                    f"{onnx_path}: tensor {vi.name} has a dynamic dimension "
                    f"({d.dim_param or '?'}); a deployment graph has static shapes."
                )
            dims.append(int(d.dim_value))
        return dims

    inits = {i.name for i in model.graph.initializer}
    ins = {vi.name: shape(vi) for vi in model.graph.input if vi.name not in inits}
    outs = {vi.name: shape(vi) for vi in model.graph.output}
    ints = {}
    for vi in [*model.graph.input, *model.graph.output]:
        elem = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        if elem.kind in "iu":
            ints[vi.name] = str(elem)
    return ins, outs, ints


def _ordered(
    shapes: dict[str, list[int]], names: list[str] | None, what: str, graph: str
) -> dict[str, list[int]]:
    if not names:
        return shapes
    missing = [n for n in names if n not in shapes]
    if missing:
        raise MetadataError(
            f"Graph {graph}: {what} {', '.join(missing)} named in quantize.json are not in the "
            f"graph (it has {', '.join(shapes)})."
        )
    return {n: shapes[n] for n in names}


def graph_spec(graph_entry: dict[str, Any], quantize_dir: Path) -> dict[str, Any]:
    """{"inputs": {name: tensor spec}, "outputs": {...}} for one quantize.json graph entry: shapes from
    `graph_entry["io"]` when present, else read from its ONNX; dtypes and quantization from its
    encodings; order as quantize.json lists the names (else the ONNX's)."""
    qdir = Path(quantize_dir)
    name = str(graph_entry.get("name", "?"))
    ints: dict[str, str] = {}
    if graph_entry.get("io"):
        ins, outs = _io_from_entry(graph_entry["io"])
    else:
        if not graph_entry.get("onnx"):
            raise MetadataError(f"Graph {name} has neither io shapes nor an ONNX in quantize.json.")
        ins, outs, ints = onnx_io_types(qdir / graph_entry["onnx"])
    ins = _ordered(ins, graph_entry.get("inputs"), "inputs", name)
    outs = _ordered(outs, graph_entry.get("outputs"), "outputs", name)
    encs = read_encodings(qdir / graph_entry["encodings"]) if graph_entry.get("encodings") else {}
    return {
        "inputs": {n: tensor_spec(n, s, encs.get(n), ints.get(n)) for n, s in ins.items()},
        "outputs": {n: tensor_spec(n, s, encs.get(n), ints.get(n)) for n, s in outs.items()},
    }


def precision_name(q: dict[str, Any]) -> str:
    """qai-hub-models' precision string ("w4a16") from quantize.json's precision block."""
    p = q.get("precision") or {}
    w = re.search(r"int(\d+)", str(p.get("weights", "")))
    a = re.search(r"int(\d+)", str(p.get("activations", "")))
    return f"w{w.group(1) if w else 4}a{a.group(1) if a else 16}"


def build_metadata(
    graphs: list[dict[str, Any]], quantize_dir: Path, precision: str | None = None
) -> dict[str, Any]:
    """metadata.yaml's document for the quantize.json graphs: components ordered prompt parts, then
    token parts (as qai-hub-models adds them), then precision (None: quantize.json's, w4a16 where it says none)
    and runtime."""
    if precision is None:
        try:
            q = json.loads((quantize_dir / "quantize.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            q = {}
        precision = precision_name(q if isinstance(q, dict) else {})
    comps: dict[str, Any] = {}
    order = {"prompt": 0, "token": 1}
    main_ar, main_cl = main_variant([str(g["name"]) for g in graphs])
    for g in sorted(
        graphs,
        key=lambda g: (
            order[component_name(str(g["name"])).split("_", 1)[0]],
            int(g.get("part") or 0),
            str(g["name"]),
        ),
    ):
        comp = variant_component(str(g["name"]), main_ar, main_cl)
        if comp in comps:
            raise MetadataError(f"Two graphs map to the component {comp} (the second is {g['name']}).")
        comps[comp] = graph_spec(g, quantize_dir)
    return {"components": comps, "precision": precision, "runtime": RUNTIME}


# -- the file ------------------------------------------------------------------------------------
class _BlockDumper(yaml.SafeDumper):
    """Block style everywhere, lists included (as qai-hub-models' ruamel writer does)."""


def write_metadata(path: Path, doc: dict[str, Any]) -> None:
    """Write metadata.yaml atomically (keys in document order, block style)."""
    p = Path(path)
    text = yaml.dump(doc, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)


def read_metadata(path: Path) -> dict[str, Any]:
    """metadata.yaml as a dict; MetadataError when it is not readable or lacks `components`."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise MetadataError(f"Cannot read {path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("components"), dict):
        raise MetadataError(f"{path} has no `components` mapping (not a Genie bundle's metadata.yaml).")
    return doc
