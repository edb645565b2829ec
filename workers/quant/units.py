"""Calibration units: one deployment graph (a part) cut into consecutive sub-graphs, one decoder layer
each (the embedding and the lm_head get units of their own), so a QuantSim holds one layer's weights.

A node belongs to the unit of the deepest weight it depends on (its own weights or, through its
inputs, any earlier node's): a weight's level comes from its checkpoint name (`model.layers.N.*`
projection weights -> N; `embed_tokens` before every layer, `lm_head` after). Nodes that depend on
no weight (rotary angles, mask arithmetic) go to the first unit; constants (initializers and what is
computed from them alone) are copied into every unit that uses them. A unit's inputs are the part's
inputs and the tensors earlier units produce that it reads; its outputs are what later units or the
part's outputs read. Tensor names stay the part graph's, so the units' encodings merge back into
the part's by name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
EMBED_LEVEL = -1
HEAD_LEVEL = 1 << 30


@dataclass
class Unit:
    index: int
    level: int                          # layer index, EMBED_LEVEL or HEAD_LEVEL
    path: Path                          # the unit's ONNX (weights in `<path>.data`)
    inputs: list[str]
    outputs: list[str]
    layers: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        if self.level == EMBED_LEVEL:
            return "embedding"
        if self.level == HEAD_LEVEL:
            return "lm_head"
        return f"layer {self.level}"


def weight_level(name: str, op_type: str) -> int | None:
    """The unit level a weight pins its consumer to (None: the weight does not decide)."""
    if op_type in ("MatMul", "Gemm"):
        if "lm_head" in name:
            return HEAD_LEVEL
        m = _LAYER.search(name)
        return int(m.group(1)) if m else None
    if op_type == "Gather" and "embed_tokens" in name:
        return EMBED_LEVEL
    return None


def plan_units(model: Any) -> tuple[dict[int, list[int]], dict[int, list[str]], dict[int, list[str]]]:
    """(level -> node indices, level -> unit inputs, level -> unit outputs) for a loaded graph."""
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    graph_inputs = [i.name for i in graph.input if i.name not in inits]
    graph_outputs = [o.name for o in graph.output]
    const: set[str] = set(inits) | {""}
    level_of_tensor: dict[str, int | None] = {}
    node_level: list[int | None] = []
    is_const_node: list[bool] = []
    for node in graph.node:
        if node.op_type == "Constant" or all(x in const for x in node.input):
            const.update(node.output)
            is_const_node.append(True)
            node_level.append(None)
            continue
        is_const_node.append(False)
        lv: int | None = None
        for x in node.input:
            cand = weight_level(x, node.op_type) if x in inits else level_of_tensor.get(x)
            if cand is not None and (lv is None or cand > lv):
                lv = cand
        node_level.append(lv)
        for o in node.output:
            level_of_tensor[o] = lv
    levels = sorted({lv for lv in node_level if lv is not None})
    if not levels:
        levels = [0]
    lowest = levels[0]
    nodes: dict[int, list[int]] = {lv: [] for lv in levels}
    producer_level: dict[str, int] = {}
    for idx, node in enumerate(graph.node):
        if is_const_node[idx]:
            continue
        lv = node_level[idx]
        lv = lowest if lv is None else lv
        nodes[lv].append(idx)
        for o in node.output:
            producer_level[o] = lv
    inputs: dict[int, list[str]] = {lv: [] for lv in levels}
    outputs: dict[int, list[str]] = {lv: [] for lv in levels}
    for lv in levels:
        seen: set[str] = set()
        for idx in nodes[lv]:
            for x in graph.node[idx].input:
                if x in const or x in seen:
                    continue
                if x in graph_inputs or producer_level.get(x, lv) != lv:
                    seen.add(x)
                    inputs[lv].append(x)
                    if x in producer_level:
                        src = producer_level[x]
                        if x not in outputs[src]:
                            outputs[src].append(x)
    for o in graph_outputs:
        out_src = producer_level.get(o)
        if out_src is not None and o not in outputs[out_src]:
            outputs[out_src].append(o)
    # keep the part's own input order first (the feeds are built from it)
    for lv in levels:
        inputs[lv].sort(key=lambda n: (graph_inputs.index(n) if n in graph_inputs else len(graph_inputs)))
    return nodes, inputs, outputs


def split_units(float_onnx: Path, work: Path, tag: str, per_layer: bool = True) -> list[Unit]:
    """Cut the part graph into calibration units under `work` (one ONNX + data file each). Reads one
    unit's weights at a time from the part's files. `per_layer=False`: the whole graph is one unit
    (one QuantSim for the part, as Qualcomm's recipe does it; the memory comparison's baseline)."""
    import onnx
    from onnx import utils
    from onnx.external_data_helper import load_external_data_for_tensor

    model = onnx.load(str(float_onnx), load_external_data=False)
    if not per_layer:
        inits = {i.name for i in model.graph.initializer}
        names = [i.name for i in model.graph.input if i.name not in inits]
        layers = sorted({int(n.split("_")[2]) for n in names if n.startswith("past_key_")})
        return [Unit(0, 0, float_onnx, names, [o.name for o in model.graph.output], layers)]
    _, ins, outs = plan_units(model)
    work.mkdir(parents=True, exist_ok=True)
    extractor = utils.Extractor(onnx.shape_inference.infer_shapes(model))
    units: list[Unit] = []
    for i, lv in enumerate(sorted(ins)):
        sub = extractor.extract_model(ins[lv], outs[lv])
        for init in sub.graph.initializer:
            if any(e.key == "location" for e in init.external_data):
                load_external_data_for_tensor(init, str(float_onnx.parent))
                del init.external_data[:]
                init.data_location = onnx.TensorProto.DEFAULT
        path = work / f"{tag}_u{i}.onnx"
        (work / (path.name + ".data")).unlink(missing_ok=True)
        onnx.save(sub, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=path.name + ".data", size_threshold=1024)
        del sub
        layers = sorted({int(n.split("_")[2]) for n in ins[lv] if n.startswith("past_key_")})
        units.append(Unit(i, lv, path, list(ins[lv]), list(outs[lv]), layers))
    return units


def merge_encodings(paths: list[Path], out: Path) -> dict[str, int]:
    """The part's encodings: every unit's, by tensor name; where two units encode the same tensor (a
    tensor one unit produces and the next reads) the earlier unit's, the producer's, is kept."""
    doc: dict[str, Any] | None = None
    acts: dict[str, Any] = {}
    params: dict[str, Any] = {}
    for p in paths:
        d = json.loads(p.read_text(encoding="utf-8"))
        if doc is None:
            doc = {k: v for k, v in d.items() if k not in ("activation_encodings", "param_encodings")}
        for a in d.get("activation_encodings", []):
            acts.setdefault(a["name"], a)
        for a in d.get("param_encodings", []):
            params.setdefault(a["name"], a)
    assert doc is not None
    doc["activation_encodings"] = list(acts.values())
    doc["param_encodings"] = list(params.values())
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    tmp.replace(out)
    return {"activation_encodings": len(acts), "param_encodings": len(params)}
