"""The deployment graphs in the form QNN HTP compiles whole, with no node left for the CPU.

The Quantize stage's simulation graphs (`sim/<graph>.onnx`) are QDQ ONNX with float graph I/O: the
onnxruntime twin feeds and reads floats. Genie feeds the board's graphs quantized buffers, and QNN HTP
(2.51, checked on x86 with CPU fallback disabled) refuses three patterns in them. This module rewrites
a simulation graph into the graph that is compiled, changing no arithmetic except where it says so:

1. **Genie's I/O.** Each float graph input that is only quantized becomes the quantized tensor itself
   (uint16 attention mask and cos/sin, uint8 KV cache, uint16 hidden state between parts); each output
   that is only dequantized becomes the quantized tensor (uint16 logits, uint8 KV out). `input_ids`
   stays int32. Exact: the same Q/DQ pairs, moved across the graph boundary (facts: Genie's
   nsp-model.cpp reads scale/offset of every I/O tensor and quantizes what it feeds).
2. **The embedding lookup.** HTP refuses a Gather over a raw uint16 table (`Unsupported input/output
   datatypes ... Gather`, error 3110). The table is dequantized, gathered and quantized again with the
   table's own (per-tensor) encoding: DQ -> Gather -> Q. Exact: gathering rows does not change values.
   A table of fewer than 1,024 rows (the built-in models') gathers with its ids clamped to the last row:
   Genie's lookahead dialog seeds its levels with token ids 1000 + i (lhd-dec.cpp 126), which HTP would
   refuse (`bad input in InputGather2DDMA; weight sel = 1000`). Ids inside the table are unchanged, and a
   lookahead guess is only ever kept when the model itself verifies it, so the output does not change.
3. **Mixed-precision MatMuls.** A MatMul with 16-bit activations in and an 8-bit output (v_proj, whose
   output is the 8-bit KV cache) is not grouped by the QNN EP, leaving a standalone blockwise weight DQ
   that HTP refuses (`QNN EP does not support a standalone DQ op with per-channel quantization`). The
   MatMul's output is quantized at 16 bits over exactly the 8-bit range (scale/257, offset*257) and then
   converted to the 8-bit encoding: a requantization the HTP does as one Convert. Values differ from the
   direct 8-bit rounding by at most one 8-bit step (double rounding), measured by the HTP leg of
   Validate.

`deployment_io(model)` lists what the compiled graph's I/O holds, for bundle metadata and the checker.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hexstudio.shared.errors import ActionableError

# ONNX element type of the zero point -> storage type Genie feeds
_ONNX_DTYPE = {
    TensorProto.UINT8: "uint8",
    TensorProto.UINT16: "uint16",
    TensorProto.INT8: "int8",
    TensorProto.INT16: "int16",
    TensorProto.INT32: "int32",
    TensorProto.FLOAT: "float32",
}
_BITS = {TensorProto.UINT8: 8, TensorProto.INT8: 8, TensorProto.UINT16: 16, TensorProto.INT16: 16}


class HtpGraphError(ActionableError, ValueError):
    """The graph does not have the shape this rewrite expects (the message names the tensor)."""


@dataclass(frozen=True)
class IoTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    scale: float | None
    zero_point: int | None


@dataclass
class RewriteReport:
    quantized_inputs: list[str]
    quantized_outputs: list[str]
    embedding_gathers: list[str]
    requantized_matmuls: list[str]


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.m = model
        self.g = model.graph
        self.init = {t.name: t for t in self.g.initializer}
        self._index()

    def _index(self) -> None:
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        self.producer: dict[str, onnx.NodeProto] = {}
        for n in self.g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
            for o in n.output:
                self.producer[o] = n

    def const(self, name: str) -> np.ndarray:
        if name in self.init:
            return numpy_helper.to_array(self.init[name])
        p = self.producer.get(name)
        if p is not None and p.op_type == "Constant":
            return numpy_helper.to_array(p.attribute[0].t)
        raise HtpGraphError(f"{name} is not a constant")

    def zp_type(self, name: str) -> int:
        if name in self.init:
            return int(self.init[name].data_type)
        p = self.producer.get(name)
        if p is not None and p.op_type == "Constant":
            return int(p.attribute[0].t.data_type)
        raise HtpGraphError(f"the zero point {name} is not a constant")

    def rename(self, old: str, new: str) -> None:
        for n in self.g.node:
            for k, i in enumerate(n.input):
                if i == old:
                    n.input[k] = new
            for k, o in enumerate(n.output):
                if o == old:
                    n.output[k] = new

    def remove(self, nodes: list[onnx.NodeProto]) -> None:
        ids = {id(n) for n in nodes}
        keep = [n for n in self.g.node if id(n) not in ids]
        del self.g.node[:]
        self.g.node.extend(keep)
        self._index()

    def add_init(self, name: str, value: np.ndarray) -> str:
        t = numpy_helper.from_array(value, name)
        self.g.initializer.append(t)
        self.init[name] = t
        return name


def _set_elem_type(vi: onnx.ValueInfoProto, elem: int) -> None:
    vi.type.tensor_type.elem_type = elem


def _quantize_inputs(G: _Graph) -> list[str]:
    done = []
    for vi in G.g.input:
        if vi.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        users = G.consumers.get(vi.name, [])
        if not users or any(u.op_type != "QuantizeLinear" or u.input[0] != vi.name for u in users):
            continue
        first = users[0]
        scales = {float(G.const(u.input[1])) for u in users}
        zps = {int(G.const(u.input[2])) for u in users}
        if len(scales) != 1 or len(zps) != 1:
            raise HtpGraphError(f"graph input {vi.name} is quantized with more than one encoding")
        elem = G.zp_type(first.input[2])
        outs = [u.output[0] for u in users]
        G.remove(users)
        for o in outs:
            G.rename(o, vi.name)
        _set_elem_type(vi, elem)
        done.append(vi.name)
    return done


def _quantize_outputs(G: _Graph) -> list[str]:
    done = []
    for vo in G.g.output:
        p = G.producer.get(vo.name)
        if p is None or p.op_type != "DequantizeLinear" or vo.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        q_name = p.input[0]
        elem = G.zp_type(p.input[2]) if len(p.input) > 2 and p.input[2] else TensorProto.UINT8
        G.remove([p])
        if G.consumers.get(vo.name):
            raise HtpGraphError(f"graph output {vo.name} is also read inside the graph")
        G.rename(q_name, vo.name)
        _set_elem_type(vo, elem)
        done.append(vo.name)
    return done


CLAMP_IDS_BELOW_ROWS = (
    1024  # Genie's lade seeds ids 1000 + i (window <= 23 then stays inside a clamped table)
)


def _index_elem(G: _Graph, name: str) -> int:
    """The integer type of a Gather's index tensor: a graph input's, or the type a Cast makes."""
    vi = next((v for v in G.g.input if v.name == name), None)
    if vi is not None:
        return int(vi.type.tensor_type.elem_type)
    p = G.producer.get(name)
    if p is not None and p.op_type == "Cast":
        return int(next(a.i for a in p.attribute if a.name == "to"))
    raise HtpGraphError(f"the embedding lookup's ids {name} are neither a graph input nor a Cast")


def _clamped_ids(G: _Graph, gather: onnx.NodeProto, rows: int) -> list[onnx.NodeProto]:
    """Min(ids, rows - 1) in front of a small table's Gather (see the module's note 2)."""
    ids = gather.input[1]
    dtype = {TensorProto.INT32: np.int32, TensorProto.INT64: np.int64}.get(_index_elem(G, ids))
    if dtype is None:
        raise HtpGraphError(f"the embedding lookup's ids {ids} are not int32 or int64")
    last = G.add_init(f"{gather.name}__last_row", np.array(rows - 1, dtype=dtype))
    clamped = f"{ids}__clamped"
    return [helper.make_node("Min", [ids, last], [clamped], name=f"{gather.name}__ClampIds")]


def _embedding_gathers(G: _Graph) -> list[str]:
    """Gather(uint table, ids) -> DQ  ==>  DQ(table) -> Gather -> Q -> DQ (the table's own encoding), the ids
    clamped into a table of fewer than CLAMP_IDS_BELOW_ROWS rows."""
    done = []
    for n in list(G.g.node):
        if n.op_type != "Gather" or n.input[0] not in G.init:
            continue
        table = G.init[n.input[0]]
        if table.data_type not in (
            TensorProto.UINT16,
            TensorProto.UINT8,
            TensorProto.INT16,
            TensorProto.INT8,
        ):
            continue
        users = G.consumers.get(n.output[0], [])
        if len(users) != 1 or users[0].op_type != "DequantizeLinear":
            raise HtpGraphError(f"the quantized table {table.name} is gathered but not dequantized after it")
        dq = users[0]
        scale, zp = dq.input[1], dq.input[2]
        if np.asarray(G.const(scale)).size != 1:
            raise HtpGraphError(f"the embedding table {table.name} is not quantized per tensor")
        table_f = f"{table.name}__dq_table"
        gathered_f = f"{n.output[0]}__float"
        gathered_q = n.output[0]
        axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
        rows = int(table.dims[axis])
        clamp = _clamped_ids(G, n, rows) if rows < CLAMP_IDS_BELOW_ROWS else []
        ids = clamp[0].output[0] if clamp else n.input[1]
        nodes = [
            *clamp,
            helper.make_node(
                "DequantizeLinear", [table.name, scale, zp], [table_f], name=f"{n.name}__TableDQ"
            ),
            helper.make_node("Gather", [table_f, ids], [gathered_f], name=n.name, axis=axis),
            helper.make_node("QuantizeLinear", [gathered_f, scale, zp], [gathered_q], name=f"{n.name}__Q"),
        ]
        pos = list(G.g.node).index(n)
        G.g.node.remove(n)
        for k, new in enumerate(nodes):
            G.g.node.insert(pos + k, new)
        G._index()
        done.append(n.name)
    return done


def _requantize_mixed_matmuls(G: _Graph) -> list[str]:
    """MatMul(16-bit act DQ, weight DQ) -> Q(8-bit)  ==>  ... -> Q16 (same range) -> DQ -> Q8."""
    done = []
    for n in list(G.g.node):
        if n.op_type != "MatMul":
            continue
        act = G.producer.get(n.input[0])
        users = G.consumers.get(n.output[0], [])
        if (
            act is None
            or act.op_type != "DequantizeLinear"
            or len(users) != 1
            or users[0].op_type != "QuantizeLinear"
        ):
            continue
        q = users[0]
        a_t, o_t = G.zp_type(act.input[2]), G.zp_type(q.input[2])
        if (
            _BITS.get(a_t, 0) == _BITS.get(o_t, 0)
            or _BITS.get(o_t) != 8
            or o_t != TensorProto.UINT8
            or a_t != TensorProto.UINT16
        ):
            continue
        s8 = float(G.const(q.input[1]))
        z8 = int(G.const(q.input[2]))
        base = n.output[0]
        s16 = G.add_init(f"{base}__scale16", np.array(s8 / 257.0, dtype=np.float32))
        z16 = G.add_init(f"{base}__zero_point16", np.array(z8 * 257, dtype=np.uint16))
        q16, dq16 = f"{base}__q16", f"{base}__dq16"
        pos = list(G.g.node).index(q)
        G.g.node.insert(
            pos, helper.make_node("QuantizeLinear", [base, s16, z16], [q16], name=f"{n.name}__Q16")
        )
        G.g.node.insert(
            pos + 1, helper.make_node("DequantizeLinear", [q16, s16, z16], [dq16], name=f"{n.name}__DQ16")
        )
        q.input[0] = dq16
        G._index()
        done.append(n.name)
    return done


def htp_graph(model: onnx.ModelProto) -> tuple[onnx.ModelProto, RewriteReport]:
    """The simulation graph rewritten for QNN HTP (a new model; `model` is not changed)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    G = _Graph(m)
    report = RewriteReport(
        quantized_inputs=_quantize_inputs(G),
        quantized_outputs=_quantize_outputs(G),
        embedding_gathers=_embedding_gathers(G),
        requantized_matmuls=_requantize_mixed_matmuls(G),
    )
    return m, report


def deployment_io(model: onnx.ModelProto) -> tuple[list[IoTensor], list[IoTensor]]:
    """Inputs and outputs of an HTP graph: name, storage dtype, shape and (for quantized ones) encoding."""
    G = _Graph(model)

    def enc_of(name: str, is_input: bool) -> tuple[float | None, int | None]:
        if is_input:
            for u in G.consumers.get(name, []):
                if u.op_type == "DequantizeLinear" and u.input[0] == name:
                    return float(G.const(u.input[1])), int(G.const(u.input[2]))
            return None, None
        p = G.producer.get(name)
        if p is not None and p.op_type == "QuantizeLinear":
            return float(G.const(p.input[1])), int(G.const(p.input[2]))
        return None, None

    def one(vi: onnx.ValueInfoProto, is_input: bool) -> IoTensor:
        tt = vi.type.tensor_type
        scale, zp = enc_of(vi.name, is_input)
        return IoTensor(
            vi.name,
            _ONNX_DTYPE.get(tt.elem_type, str(tt.elem_type)),
            tuple(int(d.dim_value) for d in tt.shape.dim),
            scale,
            zp,
        )

    return [one(v, True) for v in G.g.input], [one(v, False) for v in G.g.output]


def genie_feed_quant(models: Iterable[onnx.ModelProto]) -> dict[str, tuple[float, int, int]]:
    """How Genie quantizes what it feeds and reads, from the graphs' own I/O encodings: name -> (scale, QNN offset
    = -zero point, bits) for every 8/16-bit tensor (a KV tensor is tied in and out, so its first encoding holds)."""
    quant: dict[str, tuple[float, int, int]] = {}
    for model in models:
        ins, outs = deployment_io(model)
        for t in [*ins, *outs]:
            if t.scale is not None and t.dtype in ("uint8", "uint16"):
                quant.setdefault(
                    t.name, (float(t.scale), -int(t.zero_point or 0), 8 if t.dtype == "uint8" else 16)
                )
    return quant


def load_sim_graph(path: Path) -> onnx.ModelProto:
    """A simulation graph without its weights: they stay in the external data files the rewrite never changes
    (nothing is read or copied: at 8B shapes they are gigabytes)."""
    return onnx.load(os.fspath(path), load_external_data=False)


def save_htp_graph(model: onnx.ModelProto, dest: Path, src_dir: Path) -> None:
    """Write the rewritten graph at `dest`, its weights still referencing the simulation graph's external data
    files, copied beside it."""
    locations = set()
    for t in model.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            loc = next((e.value for e in t.external_data if e.key == "location"), None)
            if loc is None or "/" in loc or "\\" in loc or loc in (".", ".."):
                raise HtpGraphError(
                    f"the initializer {t.name} has an unexpected external data location {loc!r}"
                )
            locations.add(loc)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for loc in locations:
        target = dest.parent / loc
        if target.exists():
            continue
        # a copy: onnxruntime refuses external data reached through a symbolic link out of the model's folder
        # ("External data path escapes model directory"), and a hard link makes onnx refuse to load the
        # simulation graph's own data later ("multiple hard links ... hardlink attack")
        shutil.copy2(src_dir / loc, target)
    onnx.save(model, os.fspath(dest))
