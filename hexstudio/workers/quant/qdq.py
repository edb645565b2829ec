"""The simulation graph (QDQ ONNX) built from a float graph, its AIMET encodings and its quantized weights,
one weight at a time.

aimet-onnx's `QuantizationSimModel.to_onnx_qdq()` copies the whole model and every quantized weight at
once (measured: ~27 bytes per parameter on top of the QuantSim). This builder needs the QuantSim no
more: it reads the float graph's structure, then streams its weights one tensor at a time from the
external data file into the output's data file, replacing each encoded weight with its quantized value
(computed by AIMET's own kernel while the unit's QuantSim was alive: hexstudio/workers/quant/partwise.save_baked);
activation encodings become onnx QuantizeLinear -> DequantizeLinear pairs (uint8/uint16, zero point =
-offset, as aimet-onnx exports them). Peak memory is the graph's structure plus the largest weight.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BLOCK_BYTES = 16 << 20  # fp32 bytes of a block of rows converted to integers at a time
OPSET = 21  # QuantizeLinear/DequantizeLinear with 16-bit types

ACTIVATION_BITS = (8, 16)  # onnx QuantizeLinear's uint8 / uint16


def build_qdq(
    float_onnx: Path,
    encodings: Path,
    baked: list[Path],
    out: Path,
    share_with: tuple[Path, Path] | None = None,
) -> dict[str, int]:
    """Write `out` (+ `out.data`): `float_onnx` with its encoded weights replaced by their quantized values
    (from the `baked` safetensors files the calibration units wrote) and a QuantizeLinear ->
    DequantizeLinear pair on every encoded activation. Returns counts for the stage's stats.

    `share_with`: (float graph, simulation graph already built from it) of the part's other graph, in
    the same folders: every weight both float graphs take from the same bytes of their shared data file
    (and every encoded weight: the same quantized values) is referenced in that simulation graph's data
    file instead of being written again, so the part's simulation weights are stored once."""
    import onnx
    from onnx import helper, numpy_helper
    from safetensors import safe_open

    enc = json.loads(encodings.read_text(encoding="utf-8"))
    penc = {p["name"]: p for p in enc.get("param_encodings", [])}
    params = set(penc)
    acts = {a["name"]: a for a in enc.get("activation_encodings", [])}
    source: dict[str, Path] = {}
    for f in baked:
        with safe_open(str(f), framework="np") as sf:
            for k in sf.keys():  # noqa: SIM118 (safe_open is not a dict)
                source.setdefault(k, f)
    missing = sorted(params - set(source))
    if missing:
        raise ValueError(f"no quantized values for {len(missing)} encoded weights (first: {missing[0]})")
    model = onnx.load(str(float_onnx), load_external_data=False)
    for op in model.opset_import:  # opset 21 first: 16-bit Q/DQ and block-wise int4 DequantizeLinear
        if op.domain in ("", "ai.onnx"):
            if op.version < OPSET:
                model = _to_opset(model, OPSET)
            break
    reuse: dict[str, list[tuple[str, str]]] = {}
    if share_with is not None:
        other_float = _refs(onnx.load(str(share_with[0]), load_external_data=False))
        other_sim = onnx.load(str(share_with[1]), load_external_data=False)
        if share_with[1].parent != out.parent:
            raise ValueError("graphs that share a data file must be in one folder")
        sim_refs = {
            t.name: [(e.key, e.value) for e in t.external_data]
            for t in other_sim.graph.initializer
            if t.external_data
        }
        mine = _refs(model)
        for name, ref in mine.items():
            if name in sim_refs and (name in params or other_float.get(name) == ref):
                reuse[name] = sim_refs[name]
        del other_sim

    inits = {i.name: i for i in model.graph.initializer}
    # integer storage: int8 weights with their per-channel scales (LPBQ's int4 x 4-bit block scale is an
    # exact int8; the lm_head's int8), and a Gather-only table (the embedding) in its 16-bit encoding,
    # dequantized after the Gather (per-tensor: the same values, without dequantizing the whole table)
    forms = {n: fm for n in params & set(inits) if (fm := int_form(penc[n], list(inits[n].dims))) is not None}
    tables = gather_tables(model, acts)

    def bake(init: Any) -> np.ndarray | None:
        if init.name in tables:
            return table_ints(init, float_onnx.parent, tables[init.name])
        if init.name not in params:
            return None
        form = forms.get(init.name)
        with safe_open(str(source[init.name]), framework="np") as sf:
            sl = sf.get_slice(init.name)
            shape = tuple(int(d) for d in sl.get_shape())
            if shape != tuple(init.dims) or init.data_type != onnx.TensorProto.FLOAT:
                raise ValueError(f"{init.name}: quantized {shape} does not fit the graph's tensor")
            if form is None:
                return np.asarray(sf.get_tensor(init.name), dtype=np.float32)
            # a block of rows at a time: only the integers (1 byte or half a byte per weight) are held whole
            step = max(1, BLOCK_BYTES // (4 * shape[1]))
            if form.block:
                step = max(form.block, step // form.block * form.block)
            if shape[1] % 2:
                step += step % 2
            pieces = [
                to_ints(init.name, np.asarray(sl[r0 : min(shape[0], r0 + step)], dtype=np.float32), form, r0)
                for r0 in range(0, shape[0], step)
            ]
        return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]

    n_baked = stream_weights(model, float_onnx.parent, out.parent / (out.name + ".data"), bake, reuse)
    n_baked += sum(1 for n in reuse if n in params)
    graph = model.graph
    int_inits: list[Any] = []
    int_nodes: list[Any] = []
    for name, form in forms.items():
        init = inits[name]
        init.data_type = form.onnx_type
        dq = f"{name}__dq"
        int_inits.append(numpy_helper.from_array(form.scale, f"{name}__scale"))
        extra = {"block_size": form.block} if form.block else {}
        int_nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [name, f"{name}__scale"],
                [dq],
                name=f"{name}__Dequantize",
                axis=form.axis,
                **extra,
            )
        )
        for n in graph.node:
            for i, x in enumerate(n.input):
                if x == name:
                    n.input[i] = dq
    for name, a in tables.items():
        bw = int(a["bw"])
        inits[name].data_type = onnx.TensorProto.UINT16 if bw == 16 else onnx.TensorProto.UINT8
        s_name, z_name = f"{name}__scale", f"{name}__zero_point"
        int_inits += [
            numpy_helper.from_array(np.array(np.float32(a["scale"][0])), s_name),
            numpy_helper.from_array(
                np.array(round(-float(a["offset"][0])), dtype=np.uint16 if bw == 16 else np.uint8), z_name
            ),
        ]
        for g in (x for x in graph.node if x.op_type == "Gather" and x.input[0] == name):
            o = g.output[0]
            g.output[0] = f"{o}__gathered"
            int_nodes.append(
                helper.make_node(
                    "DequantizeLinear", [f"{o}__gathered", s_name, z_name], [o], name=f"{o}__TableDequantize"
                )
            )
        del acts[name]  # its encoding is the table's storage now (no QuantizeLinear on a table)
    graph.initializer.extend(int_inits)
    graph.node.extend(int_nodes)
    outputs = {o.name for o in graph.output}
    new_nodes: list[Any] = []
    qdq_inits: list[Any] = []
    for t, a in acts.items():
        bw = int(a["bw"])
        if bw not in ACTIVATION_BITS:
            raise ValueError(f"{t}: {bw}-bit activations have no onnx integer type (use 8 or 16)")
        scale = np.float32(a["scale"][0])
        zp = round(-float(a["offset"][0]))
        zp_np = np.array(zp, dtype=np.uint16 if bw == 16 else np.uint8)
        s_name, z_name = f"{t}__scale", f"{t}__zero_point"
        qdq_inits += [
            numpy_helper.from_array(np.array(scale, dtype=np.float32), s_name),
            numpy_helper.from_array(zp_np, z_name),
        ]
        src, dst = t, f"{t}__qdq"
        if t in outputs:
            # the graph output keeps its name and carries the quantized value
            src, dst = f"{t}__float", t
            for n in graph.node:
                for i, o in enumerate(n.output):
                    if o == t:
                        n.output[i] = src
        else:
            for n in graph.node:
                for i, name in enumerate(n.input):
                    if name == t:
                        n.input[i] = dst
        new_nodes += [
            helper.make_node("QuantizeLinear", [src, s_name, z_name], [f"{t}__q"], name=f"{t}__Quantize"),
            helper.make_node("DequantizeLinear", [f"{t}__q", s_name, z_name], [dst], name=f"{t}__Dequantize"),
        ]
    graph.initializer.extend(qdq_inits)
    graph.node.extend(new_nodes)
    _topological_sort(graph)
    onnx.save(model, str(out))
    return {
        "baked_weights": n_baked,
        "activation_qdq": len(acts),
        "shared_weights": len(reuse),
        "integer_weights": len(forms) + len(tables),
    }


class IntForm:
    """How an encoded weight is stored: int4 with per-block scales along axis 0 (LPBQ: block `block` of the
    input features, scale = channel scale x the block's 4-bit integer scale), or int8 with per-channel
    scales along axis 1 (`block` 0); zero point 0 (symmetric)."""

    def __init__(self, scale: np.ndarray, axis: int, block: int = 0) -> None:
        self.scale, self.axis, self.block = scale, axis, block

    @property
    def onnx_type(self) -> int:
        import onnx

        return int(onnx.TensorProto.INT4 if self.block else onnx.TensorProto.INT8)

    def expand(self, shape: tuple[int, ...], r0: int = 0) -> np.ndarray:
        """The scale of every element of rows [r0, r0 + shape[0]) of the weight (r0 a multiple of the block)."""
        if self.block:
            b0 = r0 // self.block
            return np.repeat(self.scale[b0 : b0 + -(-shape[0] // self.block)], self.block, axis=0)[: shape[0]]
        return self.scale.reshape(1, -1)


def int_form(enc: dict[str, Any], dims: list[int]) -> IntForm | None:
    """How a weight encoding is stored as integers: LPBQ (int4 values, 4-bit integer block scales on an 8-bit
    channel scale) as int4 with fp32 block scales along the input features; a symmetric int8 PER_CHANNEL
    encoding (the lm_head) as int8 with its channel scales. The channels are the output axis (1) of a MatMul's
    [in, out] weight. None: keep fp32."""
    kind = enc.get("enc_type")
    if kind not in ("PER_CHANNEL", "LPBQ") or int(enc.get("bw", 0)) != 8 or len(dims) != 2:
        return None
    scale = np.asarray(enc["scale"], dtype=np.float32)
    if (
        not enc.get("is_sym")
        or any(round(float(o)) != -128 for o in enc.get("offset", []))
        or dims[1] != scale.size
    ):
        return None
    if kind == "PER_CHANNEL":
        return IntForm(scale, 1)
    block = int(enc.get("block_size") or 0)
    ib = np.asarray(enc.get("per_block_int_scale") or [], dtype=np.float32)
    if (
        int(enc.get("compressed_bw", 0)) != 4
        or not block
        or dims[0] % block
        or ib.size != scale.size * dims[0] // block
    ):
        return None
    # [blocks, out]: the block scale of input rows [k*block, (k+1)*block) of output channel c
    return IntForm(np.ascontiguousarray((scale.reshape(-1, 1) * ib.reshape(scale.size, -1)).T), 0, block)


MAX_ULPS = 4  # AIMET's LPBQ kernel rounds its block scale differently from an fp32 multiply: <= 2 ulps seen


def to_ints(name: str, w: np.ndarray, form: IntForm, r0: int = 0) -> np.ndarray:
    """The integer values of rows [r0, ...) of a fake-quantized weight (int4 packed two per byte, low nibble
    first, as onnx stores INT4), checked to dequantize to AIMET's float32 values within MAX_ULPS."""
    s = form.expand(w.shape, r0)
    q = np.rint(w / s)
    lo, hi = (-8, 7) if form.block else (-128, 127)
    back = (q.astype(np.float32) * s).astype(np.float32)
    ulps = np.abs(back - w) / np.spacing(np.maximum(np.abs(w), np.float32(1e-30)))
    if q.min() < lo or q.max() > hi or not float(np.max(ulps, initial=0.0)) <= MAX_ULPS:
        raise ValueError(
            f"{name}: the quantized weight is not an int{4 if form.block else 8} multiple of its scales"
        )
    qi = q.astype(np.int8)
    del q, back, ulps
    if not form.block:
        return qi.reshape(-1)
    flat = qi.reshape(-1)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.int8)])
    u = flat.view(np.uint8) & 0x0F
    return np.ascontiguousarray(u[0::2] | (u[1::2] << 4)).astype(np.uint8)


def dequantize_weight(model: Any, name: str, base_dir: Path) -> np.ndarray:
    """A simulation graph's weight as the graph computes it (for checks): its integers times its scales."""
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    node = next((n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == name), None)
    arr = numpy_helper.to_array(inits[name], base_dir=str(base_dir))
    if node is None:
        return np.asarray(arr, np.float32)
    scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
    attrs = {a.name: a.i for a in node.attribute}
    q = arr.astype(np.float32)
    if attrs.get("block_size"):
        s = np.repeat(scale, attrs["block_size"], axis=attrs.get("axis", 1))[: q.shape[0]]
    elif scale.ndim == 1 and scale.size > 1:
        shape = [1] * q.ndim
        shape[attrs.get("axis", 1)] = scale.size
        s = scale.reshape(shape)
    else:
        s = scale
    return (q * s).astype(np.float32)


def gather_tables(model: Any, acts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The float initializers only axis-0 Gathers read (the embedding table) whose own 8- or 16-bit
    per-tensor encoding is in `acts` (the Gather's output takes it: genie-contract.md §3): name -> encoding.
    Such a table can be stored as its integers and dequantized after (or, uploaded, before) the Gather."""
    import onnx

    inits = {i.name: i for i in model.graph.initializer}
    out: dict[str, dict[str, Any]] = {}
    for n, a in acts.items():
        if (
            n not in inits
            or inits[n].data_type != onnx.TensorProto.FLOAT
            or int(a["bw"]) not in ACTIVATION_BITS
        ):
            continue
        users = [x for x in model.graph.node if n in x.input]
        if users and all(
            x.op_type == "Gather"
            and x.input[0] == n
            and not any(at.name == "axis" and at.i != 0 for at in x.attribute)
            for x in users
        ):
            out[n] = a
    return out


def table_ints(init: Any, src_dir: Path, a: dict[str, Any]) -> np.ndarray:
    """A float32 table (in external data) quantized to its per-tensor encoding as onnx QuantizeLinear does
    it (round half to even, saturate), a block of rows at a time (table_rows' rounding, without its check)."""
    from hexstudio.workers.quant.units import _source

    src = _source(init, src_dir)
    if src is None:
        raise ValueError(f"{init.name}: not a 2-D float32 table in external data")
    out: np.ndarray = np.empty((src.rows, src.cols), np.uint16 if int(a["bw"]) == 16 else np.uint8)
    for r0, block in src.blocks():
        out[r0 : r0 + block.shape[0]] = _table_codes(block, a)[0]
    return out


def _table_codes(w: np.ndarray, enc: dict[str, Any]) -> tuple[np.ndarray, np.float32, np.float32, int]:
    """(the integers as float32, scale, zero point, top): QuantizeLinear's rounding, without the exactness check
    table_ints does not need (about 1.7 s more on an 8B embedding table)."""
    bw = int(enc["bw"])
    scale, zp, top = np.float32(enc["scale"][0]), np.float32(round(-float(enc["offset"][0]))), (1 << bw) - 1
    return np.clip(np.rint(np.asarray(w, np.float32) / scale) + zp, 0, top), scale, zp, top


def table_rows(w: np.ndarray, enc: dict[str, Any]) -> tuple[np.ndarray, bool]:
    """(the integers of a table's rows under its per-tensor encoding as onnx QuantizeLinear computes them
    (round half to even, + the zero point -offset, saturated to the bit width), uint16 for 16 bits else
    uint8; whether the float (integer - zero point) x scale in fp32, the AI Hub upload's Cast -> Sub -> Mul,
    re-quantizes to the same integers). The one formula for a table's integers: the simulation graph's
    (table_ints) and the upload's (hexstudio/workers/aihub_upload.py)."""
    q, scale, zp, top = _table_codes(w, enc)
    back = (q - zp) * scale  # float32 throughout, as the upload's graph computes it
    ok = bool(np.isfinite(back).all()) and np.array_equal(np.clip(np.rint(back / scale) + zp, 0, top), q)
    return q.astype(np.uint16 if int(enc["bw"]) == 16 else np.uint8), ok


def _refs(model: Any) -> dict[str, tuple[str, str, str]]:
    """name -> (location, offset, length) of every external initializer."""
    out = {}
    for t in model.graph.initializer:
        e = {x.key: x.value for x in t.external_data}
        if "location" in e:
            out[t.name] = (e["location"], e.get("offset", "0"), e.get("length", ""))
    return out


def stream_weights(
    model: Any,
    src_dir: Path,
    data: Path,
    transform: Callable[[Any], np.ndarray | None] | None = None,
    reuse: dict[str, list[tuple[str, str]]] | None = None,
) -> int:
    """Move every initializer of `model` (structure loaded without its external data) into `data`, one
    tensor at a time; `transform(init)` may return the tensor's new value. Returns how many changed.
    `reuse`: initializers that take these external-data entries (another graph's file, same folder)
    instead of being written; no data file is written when nothing is left to write.

    The bytes never go into the loaded model: protobuf keeps a message's memory in an arena that only
    shrinks when the whole model is freed, so loading each tensor into it would hold every weight."""
    import onnx

    changed = 0
    data.parent.mkdir(parents=True, exist_ok=True)
    tmp = data.with_name(data.name + ".partial")
    reuse = reuse or {}
    with open(tmp, "wb") as fh:
        for init in model.graph.initializer:
            if init.name in reuse:
                del init.external_data[:]
                for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                    init.ClearField(f)
                for key, value in reuse[init.name]:
                    init.external_data.add(key=key, value=value)
                init.data_location = onnx.TensorProto.EXTERNAL
                continue
            new = transform(init) if transform is not None else None
            raw: bytes | memoryview
            if new is not None:
                changed += 1
                raw = memoryview(np.ascontiguousarray(new))  # written without a bytes copy
            elif any(e.key == "location" for e in init.external_data):
                raw = _read_external(init, src_dir)
            elif len(init.raw_data) >= 1024:
                raw = init.raw_data
            else:
                continue  # a small constant stays in the graph
            fh.write(b"\0" * ((-fh.tell()) % 4096))
            offset = fh.tell()
            fh.write(raw)
            del raw
            del init.external_data[:]
            for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                init.ClearField(f)
            for key, value in (
                ("location", data.name),
                ("offset", str(offset)),
                ("length", str(fh.tell() - offset)),
            ):
                entry = init.external_data.add()
                entry.key, entry.value = key, value
            init.data_location = onnx.TensorProto.EXTERNAL
        empty = fh.tell() == 0
    if empty and reuse:
        tmp.unlink()
        data.unlink(missing_ok=True)
    else:
        tmp.replace(data)
    return changed


def _read_external(init: Any, src_dir: Path) -> bytes:
    info = {e.key: e.value for e in init.external_data}
    with open(src_dir / info["location"], "rb") as f:
        f.seek(int(info.get("offset", 0)))
        length = info.get("length")
        return f.read(int(length)) if length is not None else f.read()


def data_files(model: Any) -> list[str]:
    """The external-data locations a graph (loaded without its data) references."""
    return sorted({e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"})


def link_graph(src: Path, dst: Path, data_name: str) -> None:
    """`src` as `dst` with its one external-data file hard-linked beside it as `data_name` (the references
    renamed): no second copy of the weights. Copies the data where a hard link is impossible."""
    import os
    import shutil

    import onnx

    model = onnx.load(str(src), load_external_data=False)
    locations = data_files(model)
    if len(locations) > 1:
        raise ValueError(f"{src.name} keeps its weights in {len(locations)} files: {locations}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    if locations:
        target = dst.parent / data_name
        target.unlink(missing_ok=True)
        try:
            os.link(src.parent / locations[0], target)
        except OSError:
            shutil.copyfile(src.parent / locations[0], target)
        for t in model.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = data_name
    onnx.save(model, str(dst))


def _to_opset(model: Any, version: int) -> Any:
    """Raise the opset of a graph whose weights are external (the converter sees only references)."""
    from hexstudio.workers.compat import convert_version

    return convert_version(model, version)  # keeps the external-data references (onnx 1.18 drops them)


def _topological_sort(graph: Any) -> None:
    """Reorder graph.node so every node comes after the producers of its inputs (onnx requires it)."""
    ready = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    nodes = list(graph.node)
    consumers: dict[str, list[int]] = {}
    missing = []
    for idx, n in enumerate(nodes):
        need = {x for x in n.input if x not in ready}
        missing.append(len(need))
        for x in need:
            consumers.setdefault(x, []).append(idx)
    order = [i for i, m in enumerate(missing) if m == 0]
    head = 0
    while head < len(order):
        n = nodes[order[head]]
        head += 1
        for o in n.output:
            for c in consumers.pop(o, []):
                missing[c] -= 1
                if missing[c] == 0:
                    order.append(c)
    if len(order) != len(nodes):
        raise ValueError("the graph has a cycle or an input nobody produces")
    sorted_nodes = [nodes[i] for i in order]
    del graph.node[:]
    graph.node.extend(sorted_nodes)
