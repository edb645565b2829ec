"""Read a QNN context binary back through Qualcomm's libQnnSystem: QnnSystemContext_getBinaryInfo.

What Genie sees when it loads a `.bin`: the QNN build that wrote it, the SoC model it was prepared for,
each graph's name and every input/output tensor's name, datatype, dimensions and quantization
(scale/offset). The structures follow the QAIRT SDK's public headers (include/QNN/QnnTypes.h,
include/QNN/System/QnnSystemContext.h, QnnSystemInterface.h); nothing here is guessed from the file
format. Standard library only (ctypes), so it runs in any Python beside the library.

    python -m hexstudio.workers.qnn.context_info FILE.bin [--lib libQnnSystem.so]      # prints JSON

Run it in a child process from the studio: a malformed binary must never take the GUI down with it.
"""

from __future__ import annotations

import argparse
import ctypes as C
import json
import mmap
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hexstudio.shared.errors import ActionableError

# Qnn_DataType_t (QnnTypes.h) -> the name HexStudio uses everywhere (metadata.yaml, bundle check)
DATATYPES = {
    0x0008: "int8",
    0x0016: "int16",
    0x0032: "int32",
    0x0064: "int64",
    0x0108: "uint8",
    0x0116: "uint16",
    0x0132: "uint32",
    0x0164: "uint64",
    0x0216: "float16",
    0x0232: "float32",
    0x0264: "float64",
    0x0304: "sfixed4",
    0x0308: "sfixed8",
    0x0316: "sfixed16",
    0x0332: "sfixed32",
    0x0404: "ufixed4",
    0x0408: "ufixed8",
    0x0416: "ufixed16",
    0x0432: "ufixed32",
    0x0508: "bool8",
    0x0608: "string",
}
# how a fixed-point tensor is stored, as a graph's I/O buffer holds it (Genie writes and reads these)
STORAGE = {
    "ufixed8": "uint8",
    "ufixed16": "uint16",
    "ufixed32": "uint32",
    "sfixed8": "int8",
    "sfixed16": "int16",
    "sfixed32": "int32",
    "ufixed4": "uint8",
    "sfixed4": "int8",
}
ENC_SCALE_OFFSET, ENC_AXIS_SCALE_OFFSET, ENC_BW_SCALE_OFFSET = 0, 1, 2
DEF_DEFINED = 1  # Qnn_Definition_t QNN_DEFINITION_DEFINED


class Version(C.Structure):
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32), ("patch", C.c_uint32)]

    def text(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


class ScaleOffset(C.Structure):
    _fields_ = [("scale", C.c_float), ("offset", C.c_int32)]


class AxisScaleOffset(C.Structure):
    _fields_ = [("axis", C.c_int32), ("numScaleOffsets", C.c_uint32), ("scaleOffset", C.POINTER(ScaleOffset))]


class BwScaleOffset(C.Structure):
    _fields_ = [("bitwidth", C.c_uint32), ("scale", C.c_float), ("offset", C.c_int32)]


class BwAxisScaleOffset(C.Structure):
    _fields_ = [
        ("bitwidth", C.c_uint32),
        ("axis", C.c_int32),
        ("numElements", C.c_uint32),
        ("scales", C.POINTER(C.c_float)),
        ("offsets", C.POINTER(C.c_int32)),
    ]


class TwoPointers(C.Structure):  # Qnn_BlockEncoding_t / Qnn_FloatBlockEncoding_t: read as their size only
    _fields_ = [("a", C.c_void_p), ("b", C.c_void_p)]


class QuantEncoding(C.Union):
    _fields_ = [
        ("scaleOffset", ScaleOffset),
        ("axisScaleOffset", AxisScaleOffset),
        ("bwScaleOffset", BwScaleOffset),
        ("bwAxisScaleOffset", BwAxisScaleOffset),
        ("block", TwoPointers),
        ("pointer", C.c_void_p),
    ]


class QuantizeParams(C.Structure):
    _fields_ = [("encodingDefinition", C.c_int), ("quantizationEncoding", C.c_int), ("u", QuantEncoding)]


class ClientBuffer(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dataSize", C.c_uint32)]


class TensorMem(C.Union):
    _fields_ = [("clientBuf", ClientBuffer), ("memHandle", C.c_void_p), ("retrieveRaw", C.c_void_p)]


class SparseParams(C.Structure):
    _fields_ = [("type", C.c_int), ("numSpecifiedElements", C.c_uint32), ("numSparseDimensions", C.c_uint32)]


class TensorV1(C.Structure):
    _fields_ = [
        ("id", C.c_uint32),
        ("name", C.c_char_p),
        ("type", C.c_int),
        ("dataFormat", C.c_uint32),
        ("dataType", C.c_int),
        ("quantizeParams", QuantizeParams),
        ("rank", C.c_uint32),
        ("dimensions", C.POINTER(C.c_uint32)),
        ("memType", C.c_int),
        ("mem", TensorMem),
    ]


class TensorV2(C.Structure):
    _fields_ = [
        *TensorV1._fields_,
        ("isDynamicDimensions", C.POINTER(C.c_uint8)),
        ("sparseParams", SparseParams),
        ("isProduced", C.c_uint8),
    ]


class TensorVersions(C.Union):
    _fields_ = [("v1", TensorV1), ("v2", TensorV2)]


class Tensor(C.Structure):
    _fields_ = [("version", C.c_int), ("u", TensorVersions)]


class GraphInfoV3(C.Structure):  # V1 and V2 are its prefixes
    _fields_ = [
        ("graphName", C.c_char_p),
        ("numGraphInputs", C.c_uint32),
        ("graphInputs", C.POINTER(Tensor)),
        ("numGraphOutputs", C.c_uint32),
        ("graphOutputs", C.POINTER(Tensor)),
        ("numUpdateableTensors", C.c_uint32),
        ("updateableTensors", C.POINTER(Tensor)),
        ("graphBlobInfoSize", C.c_uint32),
        ("graphBlobInfo", C.c_void_p),
        ("startOpIndex", C.c_uint32),
        ("endOpIndex", C.c_uint32),
    ]


class GraphInfo(C.Structure):
    _fields_ = [("version", C.c_int), ("v", GraphInfoV3)]


# What every QnnSystemContext_BinaryInfoV*_t starts with, and the context tensors and graphs each one carries
# (V1 and V3 place them alike; between and after them the versions differ).
_BINARY_INFO_HEAD: list[tuple[str, Any]] = [
    ("backendId", C.c_uint32),
    ("buildId", C.c_char_p),
    ("coreApiVersion", Version),
    ("backendApiVersion", Version),
    ("socVersion", C.c_char_p),
]
_BINARY_INFO_GRAPHS: list[tuple[str, Any]] = [
    ("numContextTensors", C.c_uint32),
    ("contextTensors", C.POINTER(Tensor)),
    ("numGraphs", C.c_uint32),
    ("graphs", C.POINTER(GraphInfo)),
]


class BinaryInfoV1(C.Structure):
    _fields_ = [
        *_BINARY_INFO_HEAD,
        ("hwInfoBlobVersion", Version),
        ("contextBlobVersion", Version),
        ("hwInfoBlobSize", C.c_uint32),
        ("hwInfoBlob", C.c_void_p),
        ("contextBlobSize", C.c_uint64),
        *_BINARY_INFO_GRAPHS,
    ]


class BinaryInfoV2(C.Structure):
    _fields_ = [*BinaryInfoV1._fields_, ("platformInfo", C.c_void_p)]


class BinaryInfoV3(C.Structure):
    _fields_ = [
        *_BINARY_INFO_HEAD,
        ("contextBlobVersion", Version),
        ("contextBlobSize", C.c_uint64),
        *_BINARY_INFO_GRAPHS,
        ("platformInfo", C.c_void_p),
        ("contextMetadataSize", C.c_uint32),
        ("contextMetadata", C.c_void_p),
        ("socModel", C.c_uint32),
    ]


class BinaryInfoVersions(C.Union):
    _fields_ = [("v1", BinaryInfoV1), ("v2", BinaryInfoV2), ("v3", BinaryInfoV3)]


class BinaryInfo(C.Structure):
    _fields_ = [("version", C.c_int), ("u", BinaryInfoVersions)]


CREATE = C.CFUNCTYPE(C.c_uint64, C.POINTER(C.c_void_p))
GET_BINARY_INFO = C.CFUNCTYPE(
    C.c_uint64, C.c_void_p, C.c_void_p, C.c_uint64, C.POINTER(C.POINTER(BinaryInfo)), C.POINTER(C.c_uint64)
)
FREE = C.CFUNCTYPE(C.c_uint64, C.c_void_p)


class SystemInterfaceFns(C.Structure):  # the first four members of QNN_SYSTEM_INTERFACE_VER_TYPE
    _fields_ = [
        ("systemContextCreate", CREATE),
        ("systemContextGetBinaryInfo", GET_BINARY_INFO),
        ("systemContextGetMetaData", C.c_void_p),
        ("systemContextFree", FREE),
    ]


class SystemInterface(C.Structure):
    _fields_ = [
        ("backendId", C.c_uint32),
        ("providerName", C.c_char_p),
        ("systemApiVersion", Version),
        ("fns", SystemInterfaceFns),
    ]


class ContextInfoError(ActionableError):
    """The file is not a context binary this libQnnSystem reads (the message says why)."""


@dataclass
class TensorInfo:
    name: str
    dtype: str  # storage type of the I/O buffer: uint16, uint8, int32, float32, ...
    qnn_dtype: str  # QNN's own: ufixed16, int32, ...
    shape: list[int]
    scale: float | None = None  # per-tensor quantization (Genie checks these across graphs)
    offset: int | None = None  # QNN's offset: real = scale * (q + offset); ONNX zero point = -offset
    encoding: str | None = None  # "scale_offset", "axis_scale_offset", ... or None (not quantized)


@dataclass
class GraphInfoDoc:
    name: str
    inputs: list[TensorInfo] = field(default_factory=list)
    outputs: list[TensorInfo] = field(default_factory=list)


@dataclass
class ContextInfo:
    path: str
    build_id: str  # e.g. "v2.51.0.251031..." (the QNN/QAIRT build that wrote it)
    core_api: str
    backend_api: str
    soc_version: str | None
    soc_model: int | None  # QNN's SoC model number (77: QCS9100/QCS9075, Hexagon v73), V3 only
    context_blob_size: int
    info_version: int
    graphs: list[GraphInfoDoc] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _tensor(t: Tensor) -> TensorInfo:
    v = t.u.v2 if t.version == 2 else t.u.v1
    qnn = DATATYPES.get(int(v.dataType), f"0x{int(v.dataType):04x}")
    shape = [int(v.dimensions[i]) for i in range(int(v.rank))] if v.dimensions else []
    info = TensorInfo(
        name=(v.name or b"").decode("utf-8", "replace"),
        dtype=STORAGE.get(qnn, qnn),
        qnn_dtype=qnn,
        shape=shape,
    )
    q = v.quantizeParams
    if q.encodingDefinition == DEF_DEFINED:
        if q.quantizationEncoding == ENC_SCALE_OFFSET:
            info.scale, info.offset = float(q.u.scaleOffset.scale), int(q.u.scaleOffset.offset)
            info.encoding = "scale_offset"
        elif q.quantizationEncoding == ENC_BW_SCALE_OFFSET:
            info.scale, info.offset = float(q.u.bwScaleOffset.scale), int(q.u.bwScaleOffset.offset)
            info.encoding = "bw_scale_offset"
        elif q.quantizationEncoding == ENC_AXIS_SCALE_OFFSET:
            info.encoding = "axis_scale_offset"
        else:
            info.encoding = f"encoding_{int(q.quantizationEncoding)}"
    return info


def read_context_info(path: Path, lib: Path) -> ContextInfo:
    """QnnSystemContext_getBinaryInfo of one file, through `lib` (libQnnSystem.so)."""
    try:
        qnn = C.CDLL(str(lib))
    except OSError as exc:
        raise ContextInfoError(f"Cannot load {lib}: {exc}") from None
    providers = C.POINTER(C.POINTER(SystemInterface))()
    n = C.c_uint32()
    get_providers = qnn.QnnSystemInterface_getProviders
    get_providers.argtypes = [C.POINTER(C.POINTER(C.POINTER(SystemInterface))), C.POINTER(C.c_uint32)]
    get_providers.restype = C.c_uint64
    if get_providers(C.byref(providers), C.byref(n)) != 0 or n.value < 1:
        raise ContextInfoError(f"{lib} offers no QNN system interface")
    fns = providers[0].contents.fns
    size = Path(path).stat().st_size
    if size == 0:
        raise ContextInfoError(f"{Path(path).name} is empty: not a QNN context binary")
    # the file's pages mapped (copy-on-write: QNN's buffer is not const), not read into memory twice: a part's
    # binary is gigabytes at 8B
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY) as mm:
        buf = (C.c_char * size).from_buffer(mm)
        try:  # the address only goes on: an error's traceback then holds no view of the mapping
            return _binary_info(
                fns, providers[0].contents.systemApiVersion.text(), Path(path), C.addressof(buf), size
            )
        finally:
            del buf  # the mapping closes only once no ctypes view of it is left


def _binary_info(fns: Any, api: str, path: Path, address: int, size: int) -> ContextInfo:
    handle = C.c_void_p()
    if fns.systemContextCreate(C.byref(handle)) != 0:
        raise ContextInfoError("QnnSystemContext_create failed")
    try:
        info_p = C.POINTER(BinaryInfo)()
        info_size = C.c_uint64()
        err = fns.systemContextGetBinaryInfo(
            handle, C.c_void_p(address), size, C.byref(info_p), C.byref(info_size)
        )
        if err != 0 or not info_p:
            raise ContextInfoError(
                f"{path.name} is not a QNN context binary that QNN {api}"
                f"'s libQnnSystem can read (QnnSystemContext_getBinaryInfo error {int(err) & 0xFFFF})"
            )
        bi = info_p.contents
        ver = int(bi.version)
        b: BinaryInfoV1 | BinaryInfoV2 | BinaryInfoV3 = (
            bi.u.v3 if ver == 3 else (bi.u.v2 if ver == 2 else bi.u.v1)
        )
        doc = ContextInfo(
            path=str(path),
            build_id=(b.buildId or b"").decode("utf-8", "replace"),
            core_api=b.coreApiVersion.text(),
            backend_api=b.backendApiVersion.text(),
            soc_version=b.socVersion.decode("utf-8", "replace") if b.socVersion else None,
            soc_model=int(b.socModel) if ver == 3 else None,
            context_blob_size=int(b.contextBlobSize),
            info_version=ver,
        )
        for i in range(int(b.numGraphs)):
            g = b.graphs[i].v
            gd = GraphInfoDoc(name=(g.graphName or b"").decode("utf-8", "replace"))
            gd.inputs = [_tensor(g.graphInputs[k]) for k in range(int(g.numGraphInputs))]
            gd.outputs = [_tensor(g.graphOutputs[k]) for k in range(int(g.numGraphOutputs))]
            doc.graphs.append(gd)
        return doc
    finally:
        fns.systemContextFree(handle)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hexstudio.workers.qnn.context_info",
        description="Read QNN context binaries back through libQnnSystem (JSON on stdout).",
    )
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument(
        "--lib", type=Path, default=None, help="libQnnSystem.so (default: the onnxruntime-qnn wheel's)"
    )
    args = ap.parse_args(argv)
    lib = args.lib
    if lib is None:
        from hexstudio.workers.qnn.libs import INSTALL_HINT, find_qnn_libs

        libs = find_qnn_libs()
        if libs is None:
            print(
                json.dumps(
                    {
                        "error": "qnn_missing",
                        "message": "Qualcomm's libQnnSystem.so is not installed.",
                        "hint": INSTALL_HINT,
                    }
                )
            )
            return 2
        lib = libs.system
    out: list[dict[str, object]] = []
    for f in args.files:
        try:
            out.append(read_context_info(f, lib).to_json())
        except (ContextInfoError, OSError) as exc:
            out.append({"path": str(f), "error": "unreadable", "message": str(exc)})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
