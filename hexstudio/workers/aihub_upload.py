"""What the AI Hub compile uploads for one graph, at a fraction of the bytes (issue 28, docs/aihub-upload.md).

An upload is one `<name>.aimet/` directory: `<name>.onnx`, ONE `<name>.data`, `<name>.encodings` (the qai_hub
client accepts exactly one .onnx per model directory, and a compile job compiles one uploaded model), so the
prompt processor and the token generator of a part are two uploads, each with the part's weights, as
qai-hub-models' own Genie export does. What is cut is the bytes of each: a tensor whose encoding makes it a
grid of integers is uploaded as those integers, and a few constant ops in front of its use make the float
the graph had. Every op, the encodings (keyed by `<name>`) and the graph's float interface are unchanged:

- a weight with an integer encoding (LPBQ int4 with block scales, int8 per-channel: `hexstudio.workers.quant.
  qdq.int_form`) as int8 `<name>__int` (1 byte a weight; int4 values in int8, since an INT4 tensor needs
  opset 21) and its fp32 scales `<name>__scale`: `Cast -> Mul(scale)` for a per-channel weight,
  `Cast -> Reshape [blocks, block, out] -> Mul(scale [blocks, 1, out]) -> Reshape [in, out]` for LPBQ;
- a table only Gathers read (the embedding) with its own 8/16-bit per-tensor encoding as uint16/uint8
  `<name>__int`: `Cast -> Sub(zero point) -> Mul(scale)` in front of the Gather;
- everything else (16-bit norm weights, inline constants) as it was (fp32).

The float those ops make is the quantize-dequantized tensor (one fp32 multiply per element), which
re-quantizes with the same encoding to the same integers: CHECKED for every element as it is written; a
tensor where one differs is uploaded in fp32 (`inexact`). The opset stays 17: plain Cast/Reshape/Sub/Mul on
initializers, which a converter folds into the constant it quantizes.

Memory: one block of rows of one weight at a time (the data file is read through a memory map).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hexstudio.shared.errors import ActionableError
from hexstudio.workers.quant.qdq import gather_tables, int_form, table_rows

INT_SUFFIX = "__int"  # a weight's or table's integers, made float again by the ops in front of its use
ROW_BLOCK_BYTES = 64 << 20  # fp32 bytes of one block of rows converted at a time


class UploadError(ActionableError, ValueError):
    """The graph cannot be prepared for upload (missing or several data files)."""


@dataclass
class UploadStats:
    """What one prepared upload holds."""

    bytes: int = 0  # the directory's files
    data_bytes: int = 0  # its .data file
    int_tensors: int = 0  # weights and gathered tables uploaded as their integers
    int_params: int = 0
    fp32_tensors: int = 0  # weights in external data left fp32
    fp32_params: int = 0
    inexact: list[str] = field(default_factory=list)  # integer-encoded tensors kept fp32 (not exact)


@dataclass(frozen=True)
class Encodings:
    """The two sections of an AIMET encodings file: tensor name -> encoding."""

    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    activations: dict[str, dict[str, Any]] = field(default_factory=dict)


def _section(doc: dict[str, Any], section: str) -> dict[str, dict[str, Any]]:
    """name -> encoding of one section of an encodings document (the 1.0.0 list, or the older dict form)."""
    es = doc.get(section) or []
    if isinstance(es, dict):  # the older dict form: name -> [encoding]
        return {k: (v[0] if isinstance(v, list) else v) for k, v in es.items()}
    return {str(e["name"]): e for e in es}


def load_encodings(path: Path) -> Encodings:
    """Both sections of an AIMET encodings file, read and parsed once (at 8B the file is several hundred MB)."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    return Encodings(_section(doc, "param_encodings"), _section(doc, "activation_encodings"))


def _ext(init: Any) -> dict[str, str]:
    return {e.key: e.value for e in init.external_data}


def _set_ext(init: Any, location: str, offset: int, length: int) -> None:
    del init.external_data[:]
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = init.external_data.add()
        e.key, e.value = k, v


def _form(enc: dict[str, Any] | None, dims: list[int]) -> Any:
    return int_form(enc, dims) if enc else None


def _bounds(form: Any) -> tuple[int, int]:
    return (-8, 7) if form.block else (-128, 127)


def quantize_ints(w: np.ndarray, form: Any, r0: int = 0) -> np.ndarray:
    """The integers rows [r0, ...) of weight `w` quantize to under `form` (round half to even, clamp),
    as a compiler quantizes a float weight with its encoding."""
    s = form.expand(w.shape, r0)
    lo, hi = _bounds(form)
    return np.clip(np.rint(np.asarray(w, np.float32) / s), lo, hi).astype(np.int8)


def _row_blocks(rows: int, cols: int, block: int) -> Iterator[tuple[int, int]]:
    step = max(1, ROW_BLOCK_BYTES // (4 * max(cols, 1)))
    if block:
        step = max(block, step // block * block)
    for r0 in range(0, rows, step):
        yield r0, min(rows, r0 + step)


def int_rows(w: np.ndarray, form: Any, r0: int) -> tuple[np.ndarray, bool]:
    """(the int8 integers of rows [r0, ...) of a weight, whether the float the upload's ops make of them,
    integer x scale in fp32, re-quantizes to the same integers)."""
    s = form.expand(w.shape, r0)
    q = quantize_ints(w, form, r0)
    back = q.astype(np.float32) * s
    ok = bool(np.isfinite(back).all()) and np.array_equal(quantize_ints(back, form, r0), q)
    return q, ok


def plan_bytes(onnx_path: Path, encodings: Path, compact: bool = True) -> int:
    """The bytes `write_upload_dir` will write for this graph (its .data, assuming every integer-encoded
    weight converts; + the .onnx and .encodings as they are now), read from the graph's header alone."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    doc = load_encodings(encodings) if compact else Encodings()
    encs, tables = doc.params, gather_tables(model, doc.activations)
    total = Path(onnx_path).stat().st_size + Path(encodings).stat().st_size
    for init in model.graph.initializer:
        ext = _ext(init)
        if "location" not in ext:
            continue
        n = int(np.prod(init.dims)) if init.dims else 1
        length = int(ext.get("length", 0)) or n * 4
        form = (
            _form(encs.get(init.name), list(init.dims)) if init.data_type == onnx.TensorProto.FLOAT else None
        )
        if init.name in tables:
            total += n * (2 if int(tables[init.name]["bw"]) == 16 else 1)
        elif form is not None:
            total += n + form.scale.nbytes
        else:
            total += length
    return total


def write_upload_dir(
    src_onnx: Path, encodings: Path, dest: Path, base: str, compact: bool = True
) -> tuple[Path, UploadStats]:
    """`dest/<base>.aimet/` with `<base>.onnx`, `<base>.data` (integer-encoded weights and gathered tables as
    their integers, checked exact; the rest as they were) and `<base>.encodings` (a copy). Returns (the
    directory, its stats). `compact=False` (setting aihub_compact_upload): every weight as it was (fp32)."""
    import onnx

    src_onnx, encodings = Path(src_onnx), Path(encodings)
    model = onnx.load(str(src_onnx), load_external_data=False)
    locations = sorted({_ext(t)["location"] for t in model.graph.initializer if "location" in _ext(t)})
    if len(locations) > 1:
        raise UploadError(
            f"{src_onnx.name} keeps its weights in {len(locations)} files ({', '.join(locations)}); "
            "an AI Hub upload holds one .data file"
        )
    out = dest / f"{base}.aimet"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    stats = UploadStats()
    doc = load_encodings(encodings) if compact else Encodings()
    encs, tables = doc.params, gather_tables(model, doc.activations)
    if locations:
        src_data = src_onnx.parent / locations[0]
        if not src_data.is_file():
            raise UploadError(f"{src_onnx.name}'s weights {src_data} are missing")
        data_name = f"{base}.data"
        casts: list[Any] = []
        consts: list[Any] = []
        scales: list[tuple[str, Any, list[int]]] = []
        with open(out / data_name, "wb") as fh:
            for init in model.graph.initializer:
                ext = _ext(init)
                if "location" not in ext:
                    continue
                offset, length = int(ext.get("offset", 0)), int(ext.get("length", 0))
                dims = [int(d) for d in init.dims]
                n = int(np.prod(dims)) if dims else 1
                start = fh.tell()
                table = tables.get(init.name)
                form = None
                if table is None and init.data_type == onnx.TensorProto.FLOAT:
                    form = _form(encs.get(init.name), dims)
                if table is not None or form is not None:
                    if table is not None:
                        exact = _write_table(fh, src_data, offset, dims, table)
                        kind = onnx.TensorProto.UINT16 if int(table["bw"]) == 16 else onnx.TensorProto.UINT8
                    else:
                        exact = _write_ints(fh, src_data, offset, dims, form)
                        kind = onnx.TensorProto.INT8
                    if exact:
                        name = init.name
                        init.name, init.data_type = name + INT_SUFFIX, kind
                        _set_ext(init, data_name, start, fh.tell() - start)
                        if table is not None:
                            consts += _table_constants(name, table)
                            casts += _dequantize_nodes(name)
                        else:
                            scales.append((name, form, dims))
                            casts += _weight_nodes(name, form, dims)
                        stats.int_tensors += 1
                        stats.int_params += n
                        continue
                    fh.seek(start)  # not exact: the fp32 tensor as it was
                    fh.truncate()
                    stats.inexact.append(init.name)
                _copy(fh, src_data, offset, length)
                _set_ext(init, data_name, start, length)
                stats.fp32_tensors += 1
                stats.fp32_params += n
            for name, form, dims in scales:  # the weights' scales, after the weights, in the same data file
                consts += _scale_constants(fh, data_name, name, form, dims)
            stats.data_bytes = fh.tell()
        model.graph.initializer.extend(consts)
        if casts:
            nodes = list(model.graph.node)
            del model.graph.node[:]
            model.graph.node.extend(casts + nodes)
    onnx.save(model, str(out / f"{base}.onnx"))
    shutil.copyfile(encodings, out / f"{base}.encodings")
    stats.bytes = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    return out, stats


def _table_constants(name: str, enc: dict[str, Any]) -> list[Any]:
    from onnx import numpy_helper

    return [
        numpy_helper.from_array(np.array(np.float32(round(-float(enc["offset"][0])))), f"{name}__zero_point"),
        numpy_helper.from_array(np.array(np.float32(enc["scale"][0])), f"{name}__scale"),
    ]


def _dequantize_nodes(name: str) -> list[Any]:
    """`<name>` = (float(<name>__int) - zero point) * scale: every op and the encodings keyed by `<name>`
    stay as they were. Plain Cast/Sub/Mul on constants (opset 17: a uint16 DequantizeLinear needs 21)."""
    from onnx import TensorProto, helper

    f, c = f"{name}__float", f"{name}__centered"
    return [
        helper.make_node("Cast", [name + INT_SUFFIX], [f], name=f"{name}_to_float", to=TensorProto.FLOAT),
        helper.make_node("Sub", [f, f"{name}__zero_point"], [c], name=f"{name}_minus_zero_point"),
        helper.make_node("Mul", [c, f"{name}__scale"], [name], name=f"{name}_times_scale"),
    ]


def _write_rows(
    fh: Any, src: Path, offset: int, dims: list[int], block: int, convert: Callable[[np.ndarray, int], tuple]
) -> bool:
    """Write `convert(rows, r0)`'s integers of a float32 tensor a block of rows at a time; False (at the first
    block whose integers do not re-quantize exactly) leaves the caller to truncate and write fp32 instead."""
    rows, cols = dims[0], int(np.prod(dims[1:])) if len(dims) > 1 else 1
    w: Any = np.memmap(src, dtype=np.float32, mode="r", offset=offset, shape=(rows, cols))
    try:
        for r0, r1 in _row_blocks(rows, cols, block):
            q, ok = convert(np.asarray(w[r0:r1]), r0)
            if not ok:
                return False
            fh.write(np.ascontiguousarray(q).tobytes())
        return True
    finally:
        del w


def _write_table(fh: Any, src: Path, offset: int, dims: list[int], enc: dict[str, Any]) -> bool:
    """A gathered table's integers (uint16/uint8 under its per-tensor encoding)."""
    return len(dims) == 2 and _write_rows(fh, src, offset, dims, 0, lambda w, _r0: table_rows(w, enc))


def _write_ints(fh: Any, src: Path, offset: int, dims: list[int], form: Any) -> bool:
    """A float32 weight's int8 integers (int4 LPBQ values or int8 per channel)."""
    return _write_rows(fh, src, offset, dims, form.block, lambda w, r0: int_rows(w, form, r0))


def _scale_shape(form: Any, dims: list[int]) -> list[int]:
    """The scale initializer's shape: [out] per channel, [blocks, 1, out] for LPBQ (broadcast over a block)."""
    return [dims[0] // form.block, 1, dims[1]] if form.block else [dims[1]]


def _scale_constants(fh: Any, data_name: str, name: str, form: Any, dims: list[int]) -> list[Any]:
    """`<name>__scale` written to the data file (LPBQ's are blocks x out floats: megabytes at 8B shapes) and,
    for LPBQ, the two int64 shapes of its Reshapes (inline)."""
    from onnx import TensorProto, numpy_helper

    start = fh.tell()
    arr = np.ascontiguousarray(form.scale, dtype=np.float32)
    fh.write(arr.tobytes())
    init = TensorProto(name=f"{name}__scale", data_type=TensorProto.FLOAT, dims=_scale_shape(form, dims))
    init.data_location = TensorProto.EXTERNAL
    _set_ext(init, data_name, start, fh.tell() - start)
    out = [init]
    if form.block:
        out += [
            numpy_helper.from_array(
                np.array([dims[0] // form.block, form.block, dims[1]], np.int64), f"{name}__blocks"
            ),
            numpy_helper.from_array(np.array(dims, np.int64), f"{name}__shape"),
        ]
    return out


def _weight_nodes(name: str, form: Any, dims: list[int]) -> list[Any]:
    """`<name>` = float(<name>__int) x its scales (per channel; per block of input rows for LPBQ)."""
    from onnx import TensorProto, helper

    f = f"{name}__float"
    nodes = [
        helper.make_node("Cast", [name + INT_SUFFIX], [f], name=f"{name}_to_float", to=TensorProto.FLOAT)
    ]
    if not form.block:
        return [*nodes, helper.make_node("Mul", [f, f"{name}__scale"], [name], name=f"{name}_times_scale")]
    b, m = f"{name}__by_block", f"{name}__scaled"
    return [
        *nodes,
        helper.make_node("Reshape", [f, f"{name}__blocks"], [b], name=f"{name}_into_blocks"),
        helper.make_node("Mul", [b, f"{name}__scale"], [m], name=f"{name}_times_scale"),
        helper.make_node("Reshape", [m, f"{name}__shape"], [name], name=f"{name}_from_blocks"),
    ]


def _copy(fh: Any, src: Path, offset: int, length: int) -> None:
    with open(src, "rb") as sf:
        sf.seek(offset)
        left = length
        while left:
            buf = sf.read(min(left, ROW_BLOCK_BYTES))
            if not buf:
                raise UploadError(f"{src} ends before offset {offset} + {length}")
            fh.write(buf)
            left -= len(buf)


def uploaded_weight(aimet_dir: Path, name: str) -> np.ndarray:
    """A weight as the upload's graph makes it (from its integers and scales, or as it was), as float32: for
    checks."""
    import onnx
    from onnx import numpy_helper

    d = Path(aimet_dir)
    model = onnx.load(str(next(d.glob("*.onnx"))), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}

    def read(init: Any) -> np.ndarray:
        if not init.external_data:
            return np.asarray(numpy_helper.to_array(init))
        ext = _ext(init)
        dtype = {
            onnx.TensorProto.INT8: np.int8,
            onnx.TensorProto.UINT16: np.uint16,
            onnx.TensorProto.UINT8: np.uint8,
        }.get(init.data_type, np.float32)
        arr = np.fromfile(
            d / ext["location"], dtype=dtype, count=int(np.prod(init.dims)), offset=int(ext.get("offset", 0))
        )
        return arr.reshape([int(x) for x in init.dims])

    ints = inits.get(name + INT_SUFFIX)
    if ints is None:
        return read(inits[name]).astype(np.float32)
    q: np.ndarray = read(ints).astype(np.float32)
    scale: np.ndarray = read(inits[f"{name}__scale"]).astype(np.float32)
    if ints.data_type != onnx.TensorProto.INT8:  # a gathered table: (q - zero point) x scale
        return (q - read(inits[f"{name}__zero_point"]).astype(np.float32)) * scale
    if scale.ndim == 3:  # LPBQ: per block of input rows
        blocks, _, out = scale.shape
        return (q.reshape(blocks, -1, out) * scale).reshape(q.shape)
    return q * scale


def zipped_bytes(aimet_dir: Path, work: Path) -> int:
    """The bytes the qai_hub client sends for this directory: it zips it (deflate, level 1:
    qai_hub.util.zipped_model.zip_model) and uploads the zip. Zips into `work` and removes the zip."""
    from qai_hub.util.zipped_model import zip_model

    work.mkdir(parents=True, exist_ok=True)
    z = Path(zip_model(str(work), str(aimet_dir)))
    try:
        return z.stat().st_size
    finally:
        os.unlink(z)
