"""Sequential part-wise W4A16 quantization with a real aimet_onnx QuantizationSimModel.

Part k is calibrated on the QUANTIZED outputs of part k-1 (run through the QDQ ONNX of part
k-1). Only one calibration unit's QuantSim lives at a time (fresh temp folder each: facts pitfall 3).
One calibration per part, on the prompt processor, gives the part's one encodings file, which its
token generator uses too (same tensor names), as qai-hub-models does: every tensor the two graphs
share has one encoding (Genie's identical-quantization rule; one set of weights on the device).
"""

from __future__ import annotations

import gc
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from hexstudio.shared.run_settings import RunSettings
from hexstudio.workers.quant import aimet_compat
from hexstudio.workers.quant.calib import Block, pp_mask
from hexstudio.workers.quant.io_encodings import (
    ENCODING_VERSION,
    propagate_memory_encodings,
    tie_io_encodings,
)
from hexstudio.workers.quant.qdq import build_qdq, link_graph
from hexstudio.workers.quant.tensorfile import write_f32_tensors
from hexstudio.workers.quant.units import (
    TableSource,
    Unit,
    merge_column_chunks,
    merge_encodings,
    remap_ids,
    split_units,
)

ProgressFn = Callable[[str, int, int], None]  # (graph name, sample index, total)


def _weight_nodes(model: Any) -> tuple[list[str], list[str], list[str]]:
    """(backbone MatMul/Gemm nodes, lm_head nodes, Gather (embedding) nodes) with constant weights."""
    inits = {i.name: list(i.dims) for i in model.graph.initializer}
    backbone, head, embed = [], [], []
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in inits:
            if "lm_head" in node.input[1]:
                head.append(node.name)
            else:
                backbone.append(node.name)
        elif (
            node.op_type == "Gather"
            and node.input
            and node.input[0] in inits
            and len(inits[node.input[0]]) == 2
        ):
            embed.append(node.name)
    return backbone, head, embed


# onnxruntime's CPU arena and memory-pattern planning keep the largest buffers of a run cached for the next;
# a calibration unit runs a handful of samples, so they only add to the peak (-45 MiB on one 12M-parameter
# layer's QuantSim, 20%; measured in-process 2026-11-23)
LEAN_SESSION = {"enable_cpu_mem_arena": False, "enable_mem_pattern": False}


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc's malloc_trim): one unit's
    QuantSim and sessions leave freed blocks that would otherwise stay in the RSS and add up over
    the units (measured: +140 MiB over the three lm_head chunks of a 32k-vocabulary model)."""
    import ctypes
    import ctypes.util

    gc.collect()
    name = ctypes.util.find_library("c")
    if name:
        try:
            ctypes.CDLL(name).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass


def target_dsp_arch(settings: RunSettings) -> str | None:
    """The Hexagon version of the device the run compiles for (setting `device`, known offline)."""
    from hexstudio.shared.bundle import KNOWN_DEVICES

    return KNOWN_DEVICES.get(settings.device, {}).get("dsp_arch")


def quantsim_kind(settings: RunSettings) -> aimet_compat.QuantsimConfigKind:
    """The run's QuantSim configuration (setting `quantsim_config`: "aimet" or "llm")."""
    want = settings.quantsim_config
    for kind in aimet_compat.QUANTSIM_CONFIGS:
        if kind == want:
            return kind
    raise ValueError(f"quantsim_config {want!r} is not one of {', '.join(aimet_compat.QUANTSIM_CONFIGS)}")


def build_sim(
    onnx_path: Path, settings: RunSettings, tmp: Path, threads: int, providers: list[str] | None = None
) -> tuple[Any, dict[str, int]]:
    """The unit's QuantSim under the run's configuration (quantsim_kind): int16 activations, LPBQ int4 backbone
    weights, int8 lm_head, 8-bit KV tensors (through hexstudio/workers/quant/aimet_compat.py: the same calls on every
    supported aimet-onnx)."""
    import onnx

    wbits, abits, kvbits = settings.weight_bits, settings.activation_bits, settings.kv_bits
    model = onnx.load(str(onnx_path))
    backbone, head, embed = _weight_nodes(model)
    kv = [i.name for i in model.graph.input if i.name.startswith("past_")]
    kv += [o.name for o in model.graph.output if o.name.startswith("past_")]
    kind = quantsim_kind(settings)
    sim = aimet_compat.make_sim(
        model,
        param_bits=8,
        activation_bits=abits,
        path=str(tmp),
        providers=providers or ["CPUExecutionProvider"],
        session_options={"intra_op_num_threads": threads, **LEAN_SESSION},
        config_file=aimet_compat.quantsim_config(target_dsp_arch(settings), kind),
        llm_globals=kind == "llm",
    )
    del model
    if wbits == 4:  # LPBQ: int4 with 4-bit block scales, decompressed to 8 bits on HTP
        aimet_compat.set_lpbq(sim, set(backbone), wbits, block_size=64, scale_bits=4)
    else:  # int8 per channel (an LPBQ of int8 would decompress to 12 bits, no HTP weight type)
        aimet_compat.set_param_bits(sim, set(backbone), wbits)
    aimet_compat.set_param_bits(sim, set(head), 8)
    unset = aimet_compat.set_tensor_bits(sim, kv, kvbits)
    if unset:  # calibrated at the activations' bits, exported at the KV's: the board would read another grid
        raise ValueError(
            f"no enabled quantizer at or above the KV tensor(s) {', '.join(unset)}: they cannot be calibrated "
            f"{kvbits}-bit (quantsim_config {kind}; the other one, --set quantsim_config=..., may quantize them)"
        )
    counts = {
        "backbone_weights": len(backbone),
        "lm_head_weights": len(head),
        "embedding_weights": len(embed),
        "kv_tensors": len(kv),
        "cuda": int("CUDAExecutionProvider" in (providers or [])),
    }
    return sim, counts


def count_encodings(enc_path: Path) -> dict[str, int]:
    data = json.loads(enc_path.read_text())
    params = data.get("param_encodings", [])
    acts = data.get("activation_encodings", [])
    lpbq = sum(1 for p in params if isinstance(p, dict) and p.get("enc_type") == "LPBQ")
    return {
        "param_encodings": len(params),
        "activation_encodings": len(acts),
        "lpbq_weight_encodings": lpbq,
        "int4_lpbq_weight_encodings": sum(
            1
            for p in params
            if isinstance(p, dict) and p.get("enc_type") == "LPBQ" and p.get("compressed_bw") == 4
        ),
    }


FeedFactory = Callable[[], Iterator[dict[str, np.ndarray]]]


def ort_providers(log: Callable[[str], None] | None = None) -> list[str]:
    """CUDAExecutionProvider when the installed onnxruntime has it (onnxruntime-gpu), else CPU."""
    import onnxruntime as ort

    avail = ort.get_available_providers()
    prov = (
        ["CUDAExecutionProvider", "CPUExecutionProvider"]
        if "CUDAExecutionProvider" in avail
        else ["CPUExecutionProvider"]
    )
    if log is not None:
        log(f"onnxruntime providers: {', '.join(prov)} (available: {', '.join(avail)})")
    return prov


def quantize_unit(
    unit: Unit,
    enc_out: Path,
    feeds: FeedFactory,
    settings: RunSettings,
    threads: int,
    providers: list[str] | None = None,
) -> dict[str, int]:
    """QuantSim one calibration unit, calibrate it on `feeds()` (one sample in memory at a time) and write
    its encodings to `enc_out` and its quantized weights beside it (baked_path). Frees the sim."""
    tmp = Path(tempfile.mkdtemp(prefix=f"hexq-{unit.path.stem}-"))
    try:
        sim, counts = build_sim(unit.path, settings, tmp, threads, providers)
        full: dict[str, TableSource] = {}
        if unit.table is not None and unit.table_source is not None:
            q = sim.qc_quantize_op_dict.get(unit.table)
            if q is not None and q.enabled:
                if q.quant_info.usePerChannelMode:
                    # the compacted table keeps the whole table's extremes, not every channel's
                    raise ValueError(
                        f"{unit.table} is quantized per channel by this configuration; calibrate "
                        "the embedding unit with its whole table (split_units without vocab_ids)"
                    )
                full[unit.table] = unit.table_source
        if unit.columns is not None and unit.columns[0] > 0:
            counts = {
                k: 0 if k == "lm_head_weights" else v for k, v in counts.items()
            }  # one weight, in chunks
        sim.compute_encodings(feeds())
        pin_encoding_version()
        sim.export(str(tmp), "unit", export_model=False)
        version = json.loads((tmp / "unit.encodings").read_text(encoding="utf-8")).get("version")
        if version != ENCODING_VERSION:
            raise ValueError(
                f"aimet-onnx wrote encodings format {version!r}, not {ENCODING_VERSION}: HexStudio, AI Hub "
                "and the simulator read 1.0.0"
            )
        save_baked(sim, baked_path(enc_out), full)
        del sim
        gc.collect()
        shutil.move(str(tmp / "unit.encodings"), enc_out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        release_memory()
    return counts


def pin_encoding_version() -> None:
    """AIMET's encodings format pinned to 1.0.0, as qai-hub-models pins it (`_shared/llm/model.py`), never
    aimet's default, which can change between releases (and follows $AIMET_ENCODING_VERSION)."""
    try:
        from aimet_onnx.common import quantsim as aimet_quantsim
    except ImportError:  # older aimet-onnx: the format is its only one
        return
    aimet_quantsim.encoding_version = ENCODING_VERSION


def baked_path(enc: Path) -> Path:
    return enc.with_name(enc.name + ".baked.safetensors")


def save_baked(sim: Any, path: Path, full: dict[str, TableSource] | None = None) -> int:
    """The unit's quantized weights as the simulation sees them, computed by AIMET's own kernel
    (`quantize_dequantize`, what `to_onnx_qdq` folds in), one weight at a time; the simulation graph
    takes them from here. Written as a safetensors file tensor by tensor (the header first, from the
    shapes), so only one quantized weight is in memory beside the sim. `full`: weights the unit holds
    only some rows of (a compacted embedding table) with a per-tensor encoding: the whole tensor is
    streamed from its source through the same quantizer, a block of rows at a time."""
    from onnx import numpy_helper

    full = full or {}
    quantized = {}
    for init in sim.model.model.graph.initializer:
        q = sim.qc_quantize_op_dict.get(init.name)
        if q is not None and q.enabled and q.bitwidth < 32:
            quantized[init.name] = (init, q)

    def blocks(name: str) -> Iterator[np.ndarray]:
        init, q = quantized[name]
        if name in full:
            for _, block in full[name].blocks():
                yield q.quantize_dequantize(block)
        else:
            yield q.quantize_dequantize(numpy_helper.to_array(init))

    write_f32_tensors(
        path,
        {
            n: [full[n].rows, full[n].cols] if n in full else [int(d) for d in init.dims]
            for n, (init, _) in quantized.items()
        },
        blocks,
    )
    return len(quantized)


class TensorStore:
    """Per-sample values of named tensors, each in a RecordFile under one folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, RecordFile] = {}

    def append(self, name: str, a: np.ndarray) -> None:
        if name not in self.records:
            safe = hashlib.sha1(name.encode()).hexdigest()[:16]
            self.records[name] = RecordFile(self.folder / f"{safe}.rec")
        self.records[name].append(a)

    def get(self, name: str, i: int) -> np.ndarray:
        return self.records[name][i]

    def close(self) -> None:
        for r in self.records.values():
            r.close()

    def delete(self) -> None:
        for r in self.records.values():
            r.delete()
        self.records.clear()
        shutil.rmtree(self.folder, ignore_errors=True)


def run_unit_to_store(
    path: Path,
    feeds: FeedFactory,
    threads: int,
    store: TensorStore,
    keep: list[str],
    providers: list[str] | None = None,
) -> None:
    """Run a unit's QDQ graph over the feeds one sample at a time; append the outputs named in `keep` to
    the store (the next units' inputs, the part's KV and hidden-state outputs)."""
    import onnxruntime as ort

    if not keep:
        return
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    for attr, value in LEAN_SESSION.items():
        setattr(so, attr, value)
    sess = ort.InferenceSession(str(path), so, providers=providers or ["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    wanted = [n for n in names if n in keep]
    if not wanted:
        return
    for f in feeds():
        outs = sess.run(wanted, f)
        for n, v in zip(wanted, outs, strict=True):
            store.append(n, v)
        del outs
    del sess
    store.close()


class RecordFile:
    """Fixed-shape arrays appended to a flat file and read back one at a time with np.fromfile (no memory
    map: pages read do not stay in the process's RSS)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.shape: tuple[int, ...] | None = None
        self.dtype: np.dtype[Any] = np.dtype(np.float32)
        self.count = 0
        self._fh: Any = None

    def append(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a)
        if self.shape is None:
            self.shape = tuple(a.shape)
            self.dtype = a.dtype
            self._fh = open(self.path, "wb")  # noqa: SIM115 (closed in close())
        elif tuple(a.shape) != self.shape or a.dtype != self.dtype:
            raise ValueError(f"{self.path.name}: {a.dtype}{a.shape} != {self.dtype}{self.shape}")
        if self._fh is None:
            self._fh = open(self.path, "ab")  # noqa: SIM115
        self._fh.write(a.tobytes())
        self.count += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __getitem__(self, i: int) -> np.ndarray:
        assert self.shape is not None and 0 <= i < self.count
        self.close()
        n = int(np.prod(self.shape))
        return np.fromfile(self.path, dtype=self.dtype, count=n, offset=self.dtype.itemsize * n * i).reshape(
            self.shape
        )

    def __len__(self) -> int:
        return self.count

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def pp_feed_factory(
    blocks: list[Block],
    prev: TensorStore | None,
    s: int,
    cl: int,
    kvh: int,
    hd: int,
    rope: tuple[np.ndarray, np.ndarray],
    unit: Unit,
    store: TensorStore,
) -> FeedFactory:
    """The prompt-processor samples of one unit: the part's inputs it reads (tokens or the previous
    part's quantized output, read by its tensor name; mask; the rotary tables Genie would feed; an empty
    KV cache in Genie's layout) and what earlier units of this part produced for the same sample."""
    cos_t, sin_t = rope

    def feeds() -> Iterator[dict[str, np.ndarray]]:
        zk: np.ndarray = np.zeros((kvh, 1, hd, cl - s), np.float32)
        zv: np.ndarray = np.zeros((kvh, 1, cl - s, hd), np.float32)
        for b, blk in enumerate(blocks):
            f: dict[str, np.ndarray] = {}
            pos: np.ndarray = np.arange(s) + blk.start_pos
            for n in unit.inputs:
                if n == "input_ids":
                    f[n] = np.asarray([blk.ids], dtype=np.int32)
                elif n == "attention_mask":
                    f[n] = pp_mask(s, cl, blk.n_valid)
                elif n == "position_ids_cos":
                    f[n] = cos_t[pos][None, None]
                elif n == "position_ids_sin":
                    f[n] = sin_t[pos][None, None]
                elif n.startswith("past_key_") and n.endswith("_in"):
                    f[n] = zk
                elif n.startswith("past_value_") and n.endswith("_in"):
                    f[n] = zv
                elif n in store.records:
                    f[n] = store.get(n, b)
                else:  # the previous part's output, under the same name
                    assert prev is not None, n
                    f[n] = prev.get(n, b)
            yield f

    return feeds


def _sum_counts(total: dict[str, int], counts: dict[str, int]) -> None:
    for k, v in counts.items():
        total[k] = max(total.get(k, 0), v) if k == "cuda" else total.get(k, 0) + v


def _finish_part(
    part_graphs: list[dict[str, Any]],
    base: Path,
    work: Path,
    encs: list[Path],
    fixed: dict[str, dict[str, Any]],
    settings: RunSettings,
    counts: dict[str, int],
    units: int,
    seconds: float,
) -> None:
    """One encodings file for the part (every unit's, merged, then the shared-I/O contract applied:
    hexstudio/workers/quant/io_encodings.py), written for each of the part's graphs beside its AIMET export
    (parts/<graph>/model.{onnx,data,encodings}), and each graph's simulation graph sim/<graph>.onnx built
    from it with the units' quantized weights."""
    merged = work / "part.encodings"
    merge_encodings(encs, merged)
    doc = json.loads(merged.read_text(encoding="utf-8"))
    acts = {a["name"]: a for a in doc["activation_encodings"]}
    pp = part_graphs[0]
    import onnx

    structure = onnx.load(str(base / pp["float_onnx"]), load_external_data=False)
    propagate_memory_encodings(structure.graph.node, acts)
    del structure
    report = tie_io_encodings(acts, list(pp["inputs"]), list(pp["outputs"]), fixed, settings.kv_bits)
    doc["version"] = ENCODING_VERSION
    doc["activation_encodings"] = list(acts.values())
    merged.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    first: dict[str, Any] | None = None
    for g in part_graphs:
        if list(g["inputs"]) != list(pp["inputs"]) or list(g["outputs"]) != list(pp["outputs"]):
            raise ValueError(
                f"{g['name']} and {pp['name']} have different I/O names: they cannot share encodings"
            )
        gdir = base / "parts" / g["name"]
        gdir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(merged, gdir / "model.encodings")
        # the upload graph: the float graph with its (the part's one) data file hard-linked, not copied
        link_graph(base / g["float_onnx"], gdir / "model.onnx", "model.data")
        g["onnx"] = f"parts/{g['name']}/model.onnx"
        g["encodings"] = f"parts/{g['name']}/model.encodings"
        g["sim_onnx"] = f"sim/{g['name']}.onnx"
        share = None if first is None else (base / first["float_onnx"], base / first["sim_onnx"])
        built = build_qdq(
            base / g["float_onnx"],
            merged,
            [baked_path(e) for e in encs],
            base / g["sim_onnx"],
            share_with=share,
        )
        g["sim_data"] = (first or g)["sim_onnx"] + ".data"
        first = first or g
        stats: dict[str, Any] = dict(count_encodings(merged))
        stats.update(counts)
        stats.update(built)
        stats["calibration_units"] = units
        stats["seconds"] = round(seconds, 2)
        stats["encodings_from"] = pp["name"]
        g["stats"] = stats
        g["io_encodings"] = report


def _calibrate_units(
    g: dict[str, Any],
    units: list[Unit],
    feeds_for: Callable[[Unit], FeedFactory],
    n_samples: int,
    work: Path,
    tag: str,
    store: TensorStore,
    settings: RunSettings,
    threads: int,
    providers: list[str] | None,
    progress: ProgressFn,
    log: Callable[[str], None],
) -> tuple[list[Path], dict[str, int]]:
    """Calibrate one graph's units in order: QuantSim each on its feeds, then run its QDQ graph to store
    what later units and the next part read (never the KV outputs: nothing reads them during
    calibration). Returns the units' encodings files (the lm_head's column chunks merged into one) and
    the counts."""
    encs: list[Path] = []
    chunks: list[tuple[Unit, Path]] = []
    counts: dict[str, int] = {}
    total = len(units) * n_samples
    part = g["part"]
    for u in units:
        feeds = feeds_for(u)
        if u.vocab_rows is not None:
            feeds = remap_ids(feeds, u.vocab_rows)
        enc = work / f"{tag}_u{u.index}.encodings"

        def gen(u: Unit = u, feeds: FeedFactory = feeds) -> Iterator[dict[str, np.ndarray]]:
            for i, f in enumerate(feeds()):
                progress(g["name"], u.index * n_samples + i, total)
                yield f

        log(f"part {part}: calibrating {g['name']} {u.label} on {n_samples} samples")
        _sum_counts(counts, quantize_unit(u, enc, gen, settings, threads, providers=providers))
        if u.columns is not None:
            chunks.append((u, enc))
            continue
        encs.append(enc)
        keep = [o for o in u.outputs if o != "logits" and not o.startswith("past_")]
        if keep:
            qdq = work / "units" / f"{tag}_u{u.index}.qdq.onnx"
            build_qdq(u.path, enc, [baked_path(enc)], qdq)
            run_unit_to_store(qdq, feeds, threads, store, keep, providers)
            release_memory()
    if chunks:
        # the lm_head's column chunks (the graph's last unit: nothing later reads the logits)
        head = work / f"{tag}_lm_head.encodings"
        merge_column_chunks([u for u, _ in chunks], [e for _, e in chunks], head)
        encs.append(head)
    return encs, counts


def quantize_partwise(
    graphs: list[dict[str, Any]],
    base: Path,
    blocks: list[Block],
    settings: RunSettings,
    dims: dict[str, int],
    progress: ProgressFn,
    log: Callable[[str], None],
    rope: tuple[np.ndarray, np.ndarray],
    threads: int = 2,
    providers: list[str] | None = None,
    per_layer: bool = True,
    head_chunk_params: int | None = None,
) -> list[dict[str, Any]]:
    """Quantize every part in order, one calibration unit (one decoder layer, the embedding, the lm_head
    in column chunks no larger than a layer: hexstudio/workers/quant/units.py) at a time; fills in each graph entry's
    onnx/encodings/sim_onnx and stats. `graphs` entries carry float_onnx relative to `base` (the stage's
    out_dir); `rope`: the (cos, sin) tables Genie computes for this model, [context_length, head_dim/2].

    As qai-hub-models does, one calibration (on the prompt processor) gives ONE encodings file per part,
    used by both of its graphs: the token generator has the same tensor names, so every tensor shared
    between the two, every weight included, has one encoding (Genie requires it for the I/O tensors; the
    device shares the weights). Part k is calibrated on the QUANTIZED outputs of part k-1.

    Memory: one unit's QuantSim at a time; calibration samples are generated one at a time; each unit's
    quantized outputs (the next unit's inputs, the hidden states for the next part) go to record files in
    base/calib.tmp, removed at the end."""
    cl, kvh, hd = dims["context_length"], dims["num_kv_heads"], dims["head_dim"]
    parts = sorted({g["part"] for g in graphs})
    store_root = base / "calib.tmp"
    shutil.rmtree(store_root, ignore_errors=True)
    store_root.mkdir(parents=True)
    vocab_ids = np.unique(np.concatenate([np.asarray(b.ids, dtype=np.int64) for b in blocks]))
    prev: TensorStore | None = None
    fixed: dict[str, dict[str, Any]] = {}
    try:
        for k in parts:
            t0 = time.monotonic()
            # the main context length's prompt processor is calibrated; every other graph of the part (its token
            # generator, other context lengths' variants) takes its encodings
            pp = next(
                g
                for g in graphs
                if g["part"] == k and g["kind"] == "prompt_processor" and "variant_of" not in g
            )
            others = [g for g in graphs if g["part"] == k and g is not pp]
            s = int(pp["seq_len"])
            work = store_root / f"part{k}"
            units = split_units(
                base / pp["float_onnx"], work / "units", "pp", per_layer, vocab_ids, head_chunk_params
            )
            log(f"part {k}: {len(units)} calibration units ({', '.join(u.label for u in units)})")
            store = TensorStore(work / "pp")
            encs, counts = _calibrate_units(
                pp,
                units,
                partial(pp_feed_factory, blocks, prev, s, cl, kvh, hd, rope, store=store),
                len(blocks),
                work,
                "pp",
                store,
                settings,
                threads,
                providers,
                progress,
                log,
            )
            for g in others:
                log(
                    f"part {k}: {g['name']} takes the encodings of {pp['name']} (one encodings file per part, "
                    "identical tensor names)"
                )
            _finish_part(
                [pp, *others], base, work, encs, fixed, settings, counts, len(units), time.monotonic() - t0
            )
            for e in encs:  # merged into the part's encodings and simulation graphs: free the disk now
                baked_path(e).unlink(missing_ok=True)
            for g in (pp, *others):
                progress(g["name"], 1, 1)
            # the next part reads only this part's carried output
            if prev is not None:
                prev.delete()
            carried = [o for o in pp["outputs"] if o != "logits" and not o.startswith("past_")]
            for name in [n for n in store.records if n not in carried]:
                store.records.pop(name).delete()
            prev = store
            shutil.rmtree(work / "units", ignore_errors=True)
            gc.collect()
    finally:
        shutil.rmtree(store_root, ignore_errors=True)
    return graphs


def shared_weight_check(graphs: list[dict[str, Any]], base: Path) -> dict[str, Any]:
    """Count weight encodings that differ between the two graphs of each part (must be 0)."""
    result: dict[str, Any] = {}
    for g in graphs:
        if g["kind"] != "prompt_processor" or "variant_of" in g:
            continue
        t = next(
            (
                x
                for x in graphs
                if x["part"] == g["part"] and x["kind"] == "token_generator" and "variant_of" not in x
            ),
            None,
        )
        if t is None:
            continue
        a = {p["name"]: p for p in json.loads((base / g["encodings"]).read_text())["param_encodings"]}
        b = {p["name"]: p for p in json.loads((base / t["encodings"]).read_text())["param_encodings"]}
        common = set(a) & set(b)
        diff = sum(1 for n in common if a[n] != b[n])
        result[f"part_{g['part']}"] = {
            "shared": len(common),
            "different": diff,
            "only_prompt": len(set(a) - set(b)),
            "only_token": len(set(b) - set(a)),
        }
    return result
