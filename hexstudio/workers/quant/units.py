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

The vocabulary units would otherwise be the largest (an 8B Llama-3's lm_head and embedding are 525M
parameters each, 2.4x a decoder layer), so:
- the lm_head unit is cut by vocabulary columns into chunks no larger than the part's largest decoder
  layer. Its weight's int8 encodings are per output channel, so each chunk's are exactly the whole
  weight's; the logits' range is the union of the chunks' (merge_column_chunks).
- the embedding unit keeps only the table rows of the tokens the calibration samples use, plus the two
  rows holding the table's smallest and largest value, and the samples' token ids are mapped to those
  rows (remap_ids). Its output holds the same values; the table's own 16-bit per-tensor min/max
  encoding sees the same range, so it is the whole table's; the quantized table written for the
  simulation graph is the whole table, streamed through that encoding (partwise.save_baked).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from hexstudio.workers.quant.tensorfile import write_f32_tensors

BLOCK_BYTES = 16 << 20  # fp32 bytes of one block of rows when a vocabulary-sized weight is streamed
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_KV_INPUT = re.compile(r"^past_(?:key|value)_(\d+)_in$")
EMBED_LEVEL = -1
HEAD_LEVEL = 1 << 30


def unit_label(level: int, columns: tuple[int, int] | None) -> str:
    """A unit as messages name it: the embedding, the lm_head (or its chunk of columns) or layer N."""
    if level == EMBED_LEVEL:
        return "embedding"
    if level == HEAD_LEVEL:
        return "lm_head" if columns is None else f"lm_head columns {columns[0]}-{columns[1] - 1}"
    return f"layer {level}"


@dataclass(frozen=True)
class TableSource:
    """A 2-D weight (float32 unless `dtype` says otherwise) in an external data file."""

    data: Path
    offset: int
    rows: int
    cols: int
    dtype: DTypeLike = np.float32

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def read(self, r0: int, r1: int) -> np.ndarray:
        a: np.ndarray = np.fromfile(
            self.data,
            dtype=self.dtype,
            count=(r1 - r0) * self.cols,
            offset=self.offset + self.itemsize * r0 * self.cols,
        )
        return a.reshape(r1 - r0, self.cols)

    def blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        step = max(1, block_bytes // (self.itemsize * self.cols))
        for r0 in range(0, self.rows, step):
            yield r0, self.read(r0, min(self.rows, r0 + step))

    def write_columns(self, paths: list[Path], bounds: list[int]) -> None:
        """Columns [bounds[c], bounds[c + 1]) of every row into `<paths[c]>.data`, the weight read once, a block
        of rows at a time."""
        files = [open(p.with_name(p.name + ".data"), "wb") for p in paths]  # noqa: SIM115 (closed below)
        try:
            for _, block in self.blocks():
                for c, fh in enumerate(files):
                    fh.write(memoryview(np.ascontiguousarray(block[:, bounds[c] : bounds[c + 1]])))
                del block
        finally:
            for fh in files:
                fh.close()

    def column_tensor(self, name: str, data_type: int, a: int, b: int, path: Path) -> Any:
        """The initializer `name` holding columns [a, b), in the data file write_columns wrote for `path`."""
        import onnx

        t = onnx.TensorProto(name=name, data_type=data_type, dims=[self.rows, b - a])
        t.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (
            ("location", path.name + ".data"),
            ("offset", "0"),
            ("length", str(self.itemsize * self.rows * (b - a))),
        ):
            t.external_data.add(key=k, value=v)
        return t


@dataclass
class Unit:
    index: int
    level: int  # layer index, EMBED_LEVEL or HEAD_LEVEL
    path: Path  # the unit's ONNX (weights in `<path>.data`)
    inputs: list[str]
    outputs: list[str]
    layers: list[int] = field(default_factory=list)
    params: int = 0  # weight parameters the unit holds
    columns: tuple[int, int] | None = None  # an lm_head chunk: the vocabulary columns [a, b) it computes
    table: str | None = None  # a compacted embedding: its table's name ...
    vocab_rows: np.ndarray | None = None  # ... the token ids (sorted) whose rows it keeps ...
    table_source: TableSource | None = None  # ... and where the whole table is

    @property
    def label(self) -> str:
        if self.level == EMBED_LEVEL and self.vocab_rows is not None and self.table_source is not None:
            return f"embedding ({len(self.vocab_rows)} of {self.table_source.rows} rows)"
        return unit_label(self.level, self.columns)

    @property
    def key(self) -> tuple[int, tuple[int, int] | None]:
        """What a unit of the other graph of the same part must match (same layer, same columns)."""
        return self.level, self.columns


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
    # a layer's KV inputs pin what reads them to that layer (Genie's KV layout is transposed in the layer)
    level_of_tensor: dict[str, int | None] = {
        n: int(m.group(1)) for n in graph_inputs if (m := _KV_INPUT.match(n)) is not None
    }
    node_level: list[int | None] = []
    is_const_node: list[bool] = []
    weight_of: dict[str, str] = {
        n: n for n in inits
    }  # a dequantized integer weight (simulation graph) is its weight
    for node in graph.node:
        if node.op_type == "Constant" or all(x in const for x in node.input):
            const.update(node.output)
            if node.op_type == "DequantizeLinear" and node.input[0] in inits:
                weight_of[node.output[0]] = node.input[0]
            is_const_node.append(True)
            node_level.append(None)
            continue
        is_const_node.append(False)
        lv: int | None = None
        for x in node.input:
            cand = weight_level(weight_of[x], node.op_type) if x in weight_of else level_of_tensor.get(x)
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
        inputs[lv].sort(key=lambda n: graph_inputs.index(n) if n in graph_inputs else len(graph_inputs))
    return nodes, inputs, outputs


def split_units(
    float_onnx: Path,
    work: Path,
    tag: str,
    per_layer: bool = True,
    vocab_ids: np.ndarray | None = None,
    head_chunk_params: int | None = None,
) -> list[Unit]:
    """Cut the part graph into calibration units under `work` (one ONNX + data file each). Reads one
    unit's weights at a time from the part's files. `per_layer=False`: the whole graph is one unit
    (one QuantSim for the part, as Qualcomm's recipe does it; the memory comparison's baseline).
    The lm_head unit is cut into column chunks no larger than the part's largest decoder layer; with
    `vocab_ids` (every token id the calibration samples hold), the embedding unit keeps only their rows.
    `head_chunk_params` overrides the chunk bound (tests)."""
    import onnx
    from onnx import utils

    model = onnx.load(str(float_onnx), load_external_data=False)
    if not per_layer:
        inits = {i.name for i in model.graph.initializer}
        names = [i.name for i in model.graph.input if i.name not in inits]
        layers = sorted({int(n.split("_")[2]) for n in names if n.startswith("past_key_")})
        params = sum(_numel(i) for i in model.graph.initializer)
        return [Unit(0, 0, float_onnx, names, [o.name for o in model.graph.output], layers, params)]
    _, ins, outs = plan_units(model)
    work.mkdir(parents=True, exist_ok=True)
    extractor = utils.Extractor(onnx.shape_inference.infer_shapes(model))
    units: list[Unit] = []
    largest_layer = 0
    for lv in sorted(ins):
        sub = extractor.extract_model(ins[lv], outs[lv])
        params = sum(_numel(i) for i in sub.graph.initializer if len(i.dims) >= 2)
        layers = sorted({int(n.split("_")[2]) for n in ins[lv] if n.startswith("past_key_")})
        bound = head_chunk_params or largest_layer
        if lv == HEAD_LEVEL and bound and params > bound:
            head = _head_matmul(sub, float_onnx.parent)
            if head is not None:
                n_chunks = -(-params // bound)
                units += _write_column_chunks(
                    sub,
                    head,
                    float_onnx.parent,
                    work,
                    tag,
                    len(units),
                    n_chunks,
                    list(ins[lv]),
                    list(outs[lv]),
                )
                continue
        table = _embedding_table(sub) if lv == EMBED_LEVEL and vocab_ids is not None else None
        path = work / f"{tag}_u{len(units)}.onnx"
        rows, source = None, None
        if table is not None:
            assert vocab_ids is not None
            rows, source = _compact_table(
                sub, table, np.asarray(vocab_ids, dtype=np.int64), float_onnx.parent
            )
            params = sum(_numel(i) for i in sub.graph.initializer if len(i.dims) >= 2)
        _save_unit(sub, float_onnx.parent, path)
        del sub
        if lv not in (EMBED_LEVEL, HEAD_LEVEL):
            largest_layer = max(largest_layer, params)
        units.append(
            Unit(
                len(units),
                lv,
                path,
                list(ins[lv]),
                list(outs[lv]),
                layers,
                params,
                table=table,
                vocab_rows=rows,
                table_source=source,
            )
        )
    return units


def _numel(init: Any) -> int:
    return int(np.prod([int(d) for d in init.dims], dtype=np.int64))


def _save_unit(sub: Any, src_dir: Path, path: Path) -> None:
    """Save an extracted unit with its weights (read from the part's data file) in `<path>.data`."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor

    for init in sub.graph.initializer:
        if any(e.key == "location" for e in init.external_data):
            load_external_data_for_tensor(init, str(src_dir))
            del init.external_data[:]
            init.data_location = onnx.TensorProto.DEFAULT
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)
    onnx.save(
        sub,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=1024,
    )


def _head_matmul(sub: Any, src_dir: Path) -> Any | None:
    """The lm_head unit's one MatMul (hidden x weight[H, V] -> the graph's output, the weight a float32
    tensor in an external data file) when the unit is just that (then it can be cut by columns)."""
    nodes = [n for n in sub.graph.node if n.op_type != "Constant"]
    inits = {i.name: i for i in sub.graph.initializer}
    outputs = [o.name for o in sub.graph.output]
    if len(nodes) != 1 or nodes[0].op_type != "MatMul" or len(outputs) != 1:
        return None
    node = nodes[0]
    w = inits.get(node.input[1])
    if (
        w is None
        or _source(w, src_dir) is None
        or node.output[0] != outputs[0]
        or node.input[0] not in [i.name for i in sub.graph.input]
    ):
        return None
    return node


def _write_column_chunks(
    sub: Any,
    node: Any,
    src_dir: Path,
    work: Path,
    tag: str,
    first_index: int,
    n_chunks: int,
    inputs: list[str],
    outputs: list[str],
) -> list[Unit]:
    """The lm_head unit as `n_chunks` graphs, each the same MatMul on a slice of the weight's columns; the
    weight is read once, a block of rows at a time, into the chunks' data files."""
    import onnx
    from onnx import helper

    w = next(i for i in sub.graph.initializer if i.name == node.input[1])
    source = _source(w, src_dir)
    assert source is not None  # _head_matmul checked
    rows, vocab = source.rows, source.cols
    bounds = np.linspace(0, vocab, n_chunks + 1).astype(int).tolist()
    out_vi = sub.graph.output[0]
    out_dims = [
        d.dim_value if d.HasField("dim_value") else d.dim_param for d in out_vi.type.tensor_type.shape.dim
    ]
    paths = [work / f"{tag}_u{first_index + c}.onnx" for c in range(n_chunks)]
    source.write_columns(paths, bounds)
    units = []
    for c, path in enumerate(paths):
        a, b = bounds[c], bounds[c + 1]
        weight = source.column_tensor(w.name, onnx.TensorProto.FLOAT, a, b, path)
        graph = helper.make_graph(
            [node],
            f"{sub.graph.name}_columns_{a}_{b}",
            list(sub.graph.input),
            [
                helper.make_tensor_value_info(
                    out_vi.name, out_vi.type.tensor_type.elem_type, [*out_dims[:-1], b - a]
                )
            ],
            [weight],
        )
        m = helper.make_model(graph, opset_imports=list(sub.opset_import), ir_version=sub.ir_version)
        onnx.save(m, str(path))
        units.append(
            Unit(
                first_index + c,
                HEAD_LEVEL,
                path,
                list(inputs),
                list(outputs),
                [],
                rows * (b - a),
                columns=(a, b),
            )
        )
    return units


def _embedding_table(sub: Any) -> str | None:
    """The embedding unit's table when the unit's token ids reach nothing but its Gather (directly or
    through Casts), so the ids can be mapped onto a table of fewer rows; else None."""
    inits = {i.name: i for i in sub.graph.initializer}
    gathers = [
        n
        for n in sub.graph.node
        if n.op_type == "Gather"
        and n.input[0] in inits
        and len(inits[n.input[0]].dims) == 2
        and "embed_tokens" in n.input[0]
    ]
    if (
        len(gathers) != 1
        or any(a.name == "axis" and a.i != 0 for a in gathers[0].attribute)
        or not any(e.key == "location" for e in inits[gathers[0].input[0]].external_data)
    ):
        return None
    gather = gathers[0]
    frontier, seen_gather = ["input_ids"], False
    while frontier:
        t = frontier.pop()
        for n in sub.graph.node:
            if t not in n.input:
                continue
            if n is gather and list(n.input).index(t) == 1:
                seen_gather = True
            elif n.op_type == "Cast":
                frontier += list(n.output)
            else:
                return None
    return str(gather.input[0]) if seen_gather else None


def _source(init: Any, src_dir: Path) -> TableSource | None:
    import onnx

    ext = {e.key: e.value for e in init.external_data}
    if "location" not in ext or len(init.dims) != 2 or init.data_type != onnx.TensorProto.FLOAT:
        return None
    return TableSource(
        src_dir / ext["location"], int(ext.get("offset", 0)), int(init.dims[0]), int(init.dims[1])
    )


def _compact_table(sub: Any, table: str, ids: np.ndarray, src_dir: Path) -> tuple[np.ndarray, TableSource]:
    """Replace the embedding table by the rows of `ids` and the rows of its smallest and largest value
    (read from the part's data file a block at a time). Returns (kept token ids, the whole table)."""
    from onnx import numpy_helper

    init = next(i for i in sub.graph.initializer if i.name == table)
    source = _source(init, src_dir)
    if source is None:
        raise ValueError(f"{table} is not a float32 table in an external data file")
    if ids.size == 0 or ids.min() < 0 or ids.max() >= source.rows:
        raise ValueError(f"calibration token ids outside the vocabulary (0..{source.rows - 1}) of {table}")
    lo: tuple[float, int] = (np.inf, 0)
    hi: tuple[float, int] = (-np.inf, 0)
    for r0, block in source.blocks():
        i_lo, i_hi = int(np.argmin(block)), int(np.argmax(block))
        if block.flat[i_lo] < lo[0]:
            lo = (float(block.flat[i_lo]), r0 + i_lo // source.cols)
        if block.flat[i_hi] > hi[0]:
            hi = (float(block.flat[i_hi]), r0 + i_hi // source.cols)
    rows = np.unique(np.concatenate([ids, [lo[1], hi[1]]]).astype(np.int64))
    compact = np.concatenate([source.read(int(r), int(r) + 1) for r in rows])
    sub.graph.initializer.remove(init)
    sub.graph.initializer.append(numpy_helper.from_array(compact, table))
    return rows, source


def remap_ids(feeds: Any, rows: np.ndarray) -> Any:
    """A feed factory whose `input_ids` index a compacted embedding table (`rows`: the kept token ids)."""

    def remapped() -> Any:
        for f in feeds():
            if "input_ids" in f:
                ids = f["input_ids"]
                idx = np.searchsorted(rows, ids)
                if np.any(idx >= len(rows)) or np.any(rows[np.minimum(idx, len(rows) - 1)] != ids):
                    raise ValueError("a calibration sample holds a token id the compacted embedding does not")
                f = {**f, "input_ids": idx.astype(ids.dtype)}
            yield f

    return remapped


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


def _range(a: dict[str, Any]) -> tuple[float, float]:
    """The float range an asymmetric per-tensor encoding represents."""
    scale, offset = float(a["scale"][0]), float(a["offset"][0])
    return scale * offset, scale * (offset + (1 << int(a["bw"])) - 1)


def merge_column_chunks(chunks: list[Unit], encs: list[Path], out: Path) -> None:
    """One lm_head encodings file (and its quantized weights beside it, `<out>.baked.safetensors`) from the
    encodings and quantized weights of its column chunks, in column order. The weight's per-channel
    encodings are concatenated; the output's range is the union of the chunks' ranges (min/max
    calibration), re-encoded on the same grid rule (scale = range / (2^bw - 1), offset = round(min /
    scale)); every other encoding (the input's, produced by the previous unit) is the first chunk's."""
    if not chunks or any(u.columns is None for u in chunks):
        raise ValueError("merge_column_chunks takes lm_head column chunks")
    docs = [json.loads(p.read_text(encoding="utf-8")) for p in encs]
    outputs = set(chunks[0].outputs)
    doc = {k: v for k, v in docs[0].items() if k not in ("activation_encodings", "param_encodings")}
    params: dict[str, dict[str, Any]] = {}
    for d in docs:
        for p in d.get("param_encodings", []):
            if p["name"] not in params:
                params[p["name"]] = {**p, "scale": list(p["scale"]), "offset": list(p["offset"])}
                continue
            if p.get("enc_type") != "PER_CHANNEL":
                raise ValueError(
                    f"{p['name']}: a {p.get('enc_type')} weight encoding cannot be split by columns"
                )
            params[p["name"]]["scale"] += list(p["scale"])
            params[p["name"]]["offset"] += list(p["offset"])
    acts: dict[str, dict[str, Any]] = {}
    for d in docs:
        for a in d.get("activation_encodings", []):
            if a["name"] not in acts:
                acts[a["name"]] = dict(a)
            elif a["name"] in outputs:
                acts[a["name"]] = _union(acts[a["name"]], a)
    doc["activation_encodings"] = list(acts.values())
    doc["param_encodings"] = list(params.values())
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    tmp.replace(out)
    _concat_columns(
        [enc.with_name(enc.name + ".baked.safetensors") for enc in encs],
        out.with_name(out.name + ".baked.safetensors"),
    )


def _union(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One per-tensor encoding covering the ranges of `a` and `b` (same bitwidth and symmetry)."""
    if a["bw"] != b["bw"] or bool(a.get("is_sym")) != bool(b.get("is_sym")):
        raise ValueError(f"{a['name']}: cannot merge encodings of different kinds")
    if a.get("is_sym"):  # symmetric: the wider scale covers both
        return a if float(a["scale"][0]) >= float(b["scale"][0]) else b
    (lo1, hi1), (lo2, hi2) = _range(a), _range(b)
    lo, hi = min(lo1, lo2), max(hi1, hi2)
    scale = (hi - lo) / ((1 << int(a["bw"])) - 1)
    return {**a, "scale": [scale], "offset": [float(round(lo / scale))]}


def _concat_columns(files: list[Path], out: Path) -> None:
    """A safetensors file whose 2-D tensors are the column-wise concatenation of the same-named tensors
    in `files`; written a block of rows at a time."""
    from safetensors import safe_open

    handles = [safe_open(str(f), framework="np") for f in files]
    shapes: dict[str, list[int]] = {}
    for n in handles[0].keys():  # noqa: SIM118 (safe_open is not a dict)
        parts = [h.get_slice(n).get_shape() for h in handles]
        if any(len(s) != 2 or s[0] != parts[0][0] for s in parts):
            raise ValueError(f"{n}: column chunks of different heights")
        shapes[n] = [parts[0][0], sum(s[1] for s in parts)]

    def blocks(n: str) -> Iterator[np.ndarray]:
        rows, cols = shapes[n]
        step = max(1, BLOCK_BYTES // (4 * cols))
        for r0 in range(0, rows, step):
            yield np.concatenate([h.get_slice(n)[r0 : min(rows, r0 + step)] for h in handles], axis=1)

    write_f32_tensors(out, shapes, blocks)
