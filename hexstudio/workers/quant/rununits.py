"""Run units: a deployment graph (a part, float or simulation) cut into consecutive sub-graphs for
validation in bounded memory, one decoder layer, the embedding or an lm_head column chunk at a time
(hexstudio.workers.arloop.UnitSessions, run_unit_major).

The cut is the calibration units' (hexstudio.workers.quant.units.plan_units: a node goes with the deepest weight it
depends on), so tensor names stay the part graph's. Unlike calibration units, run units copy no weights:
their initializers keep referring to the part's own data file, through a hard link in the work folder
(onnxruntime reads external data only from inside the model's folder, symbolic links resolved; a copy where
the work folder is on another file system). Only the lm_head, when it is larger than the part's
largest decoder layer, is written again, as column chunks (its columns are not contiguous in the
[hidden, vocabulary] weight); a chunk computes the same MatMul on its columns followed by the same
per-tensor nodes (the simulation graph's logits QuantizeLinear -> DequantizeLinear), so the chunks'
outputs side by side are the unit's output.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hexstudio.workers.quant.units import (
    EMBED_LEVEL,
    HEAD_LEVEL,
    TableSource,
    _numel,
    plan_units,
    unit_label,
)

ELEMENTWISE = ("QuantizeLinear", "DequantizeLinear", "Identity", "Cast")


@dataclass
class RunUnit:
    path: Path
    level: int
    inputs: list[str]
    outputs: list[str]
    params: int
    columns: tuple[int, int] | None = None  # an lm_head chunk: its vocabulary columns [a, b)
    layers: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        return unit_label(self.level, self.columns)

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "path": str(self.path),
            "columns": list(self.columns) if self.columns else None,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunUnit:
        return cls(
            Path(d["path"]),
            int(d["level"]),
            list(d["inputs"]),
            list(d["outputs"]),
            int(d["params"]),
            (int(d["columns"][0]), int(d["columns"][1])) if d.get("columns") else None,
            list(d.get("layers") or []),
        )


def split_for_run(
    graph_onnx: Path,
    work: Path,
    tag: str,
    extra_outputs: set[str] | None = None,
    head_chunk_params: int | None = None,
) -> list[RunUnit]:
    """Cut `graph_onnx` into run units under `work` (ONNX structure only, weights referenced in place).
    `extra_outputs`: tensors to expose as unit outputs where a unit computes them (a layer's hidden state,
    for the float-fidelity check). `head_chunk_params`: the lm_head chunk bound (default: the largest layer)."""
    import onnx
    from onnx import utils

    work.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(graph_onnx), load_external_data=False)
    nodes, ins, outs = plan_units(model)
    produced = {lv: {o for i in idx for o in model.graph.node[i].output} for lv, idx in nodes.items()}
    for lv in outs:
        for t in sorted((extra_outputs or set()) & produced[lv]):
            if t not in outs[lv]:
                outs[lv].append(t)
    links: dict[str, str] = {}

    def link(location: str) -> str:
        if location not in links:
            name = f"{tag}.{len(links)}.data"
            target = work / name
            target.unlink(missing_ok=True)
            try:  # a hard link: onnxruntime refuses external data that resolves outside the model's folder
                os.link((graph_onnx.parent / location).resolve(), target)
            except OSError:
                shutil.copyfile(graph_onnx.parent / location, target)
            links[location] = name
        return links[location]

    extractor = utils.Extractor(onnx.shape_inference.infer_shapes(model))
    subs: list[tuple[int, Any, int]] = []
    for lv in sorted(ins):
        sub = extractor.extract_model(ins[lv], outs[lv])
        subs.append((lv, sub, sum(_numel(i) for i in sub.graph.initializer if len(i.dims) >= 2)))
    largest = max([p for lv, _, p in subs if lv not in (EMBED_LEVEL, HEAD_LEVEL)] or [0])
    bound = head_chunk_params or largest
    units: list[RunUnit] = []
    for lv, sub, params in subs:
        layers = sorted({int(n.split("_")[2]) for n in ins[lv] if n.startswith("past_key_")})
        if lv == HEAD_LEVEL and bound and params > bound:
            chunked = _head_chunks(sub, graph_onnx.parent, work, f"{tag}_u{len(units)}", -(-params // bound))
            if chunked is not None:
                units += [RunUnit(p, lv, list(ins[lv]), list(outs[lv]), n, cols) for p, cols, n in chunked]
                continue
        for init in sub.graph.initializer:
            for e in init.external_data:
                if e.key == "location":
                    e.value = link(e.value)
        path = work / f"{tag}_u{len(units)}.onnx"
        onnx.save(sub, str(path))
        units.append(RunUnit(path, lv, list(ins[lv]), list(outs[lv]), params, None, layers))
    (work / f"{tag}.units.json").write_text(json.dumps([u.to_json() for u in units]), encoding="utf-8")
    return units


def _head_chunks(
    sub: Any, src_dir: Path, work: Path, stem: str, n_chunks: int
) -> list[tuple[Path, tuple[int, int], int]] | None:
    """The lm_head unit as column chunks, when it is one MatMul whose [H, V] weight (float32, or int8 behind a
    DequantizeLinear along axis 1: the simulation graph) is in external data and whose output reaches the
    unit's only output through per-tensor element-wise nodes; else None."""
    import onnx
    from onnx import helper, numpy_helper

    g = sub.graph
    inits = {i.name: i for i in g.initializer}
    body = [n for n in g.node if n.op_type != "Constant"]
    mms = [n for n in body if n.op_type == "MatMul"]
    if len(g.output) != 1 or len(mms) != 1:
        return None
    mm = mms[0]
    dq = next((n for n in body if n.op_type == "DequantizeLinear" and n.output[0] == mm.input[1]), None)
    if dq is not None:
        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
        if axis != 1 or dq.input[0] not in inits or any(x not in inits for x in dq.input[1:] if x):
            return None
        w = inits[dq.input[0]]
    elif mm.input[1] in inits:
        w = inits[mm.input[1]]
    else:
        return None
    rest = [n for n in body if n is not mm and n is not dq]
    tail = []
    chain = mm.output[0]
    while rest:
        n = next((x for x in rest if x.input and x.input[0] == chain), None)
        scalars = n is not None and all(x in inits and _numel(inits[x]) == 1 for x in n.input[1:] if x)
        if n is None or n.op_type not in ELEMENTWISE or not scalars:
            return None
        tail.append(n)
        rest.remove(n)
        chain = n.output[0]
    ext = {e.key: e.value for e in w.external_data}
    dtypes = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.INT8: np.int8}
    if chain != g.output[0].name or "location" not in ext or len(w.dims) != 2 or w.data_type not in dtypes:
        return None
    rows, vocab = int(w.dims[0]), int(w.dims[1])
    source = TableSource(
        src_dir / ext["location"], int(ext.get("offset", 0)), rows, vocab, dtypes[w.data_type]
    )
    bounds = np.linspace(0, vocab, n_chunks + 1).astype(int).tolist()
    out_vi = g.output[0]
    dims = [
        d.dim_value if d.HasField("dim_value") else d.dim_param for d in out_vi.type.tensor_type.shape.dim
    ]
    paths = [work / f"{stem}c{c}.onnx" for c in range(n_chunks)]
    source.write_columns(paths, bounds)
    per_col = set(dq.input[1:]) if dq is not None else set()
    out = []
    for c, path in enumerate(paths):
        a, b = bounds[c], bounds[c + 1]
        wc = source.column_tensor(w.name, w.data_type, a, b, path)
        small = []
        for i in g.initializer:
            if i.name == w.name:
                continue
            # the DequantizeLinear's per-column scale / zero point
            if i.name in per_col and _numel(i) == vocab:
                small.append(numpy_helper.from_array(numpy_helper.to_array(i)[a:b], i.name))
            else:
                small.append(i)
        consts = [n for n in g.node if n.op_type == "Constant"]
        nodes = [*consts, *([dq] if dq is not None else []), mm, *tail]
        graph = helper.make_graph(
            nodes,
            f"{g.name}_columns_{a}_{b}",
            list(g.input),
            [
                helper.make_tensor_value_info(
                    out_vi.name, out_vi.type.tensor_type.elem_type, [*dims[:-1], b - a]
                )
            ],
            [wc, *small],
        )
        onnx.save(
            helper.make_model(graph, opset_imports=list(sub.opset_import), ir_version=sub.ir_version),
            str(path),
        )
        out.append((path, (a, b), rows * (b - a)))
    return out
