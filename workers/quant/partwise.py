"""Sequential part-wise W4A16 quantization with a real aimet_onnx QuantizationSimModel.

Part k is calibrated on the QUANTIZED outputs of part k-1 (run through the QDQ ONNX of part
k-1). Only one graph's QuantSim lives at a time (fresh temp folder each: facts pitfall 3).
Weight encodings are computed once on the prompt processor and frozen into the token generator
of the same part (facts pitfall 5), so the two graphs can share weights on the device.
"""

from __future__ import annotations

import gc
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from workers.quant.calib import Block, pp_mask, tg_mask, tg_positions

ProgressFn = Callable[[str, int, int], None]   # (graph name, sample index, total)


def canonical_initializer_names(onnx_path: Path, named: dict[str, np.ndarray]) -> int:
    """Rename anonymous initializers (`onnx::MatMul_637`) to the model's parameter names, matched
    by content (also transposed), so both graphs of a part name the same weight the same way.
    Graphs whose weights exceed EXTERNAL_DATA_BYTES are written with external data
    (`<graph>.onnx.data`): a single protobuf cannot exceed 2 GB."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import load_external_data_for_model

    index: dict[str, str] = {}
    for name, arr in named.items():
        a = np.ascontiguousarray(arr, dtype=np.float32)
        index[_digest(a)] = name
        if a.ndim == 2:
            index[_digest(np.ascontiguousarray(a.T))] = name
    model = onnx.load(str(onnx_path), load_external_data=False)
    old_files = {e.value for i in model.graph.initializer for e in i.external_data if e.key == "location"}
    if old_files:
        load_external_data_for_model(model, str(onnx_path.parent))
    rename: dict[str, str] = {}
    used = {i.name for i in model.graph.initializer}
    for init in model.graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT or len(init.dims) < 1:
            continue
        arr = numpy_helper.to_array(init)
        if arr.size < 16:
            continue
        target = index.get(_digest(np.ascontiguousarray(arr)))
        if target and target != init.name and target not in used:
            rename[init.name] = target
            used.add(target)
    if not rename and not old_files:
        return 0
    for init in model.graph.initializer:
        if init.name in rename:
            init.name = rename[init.name]
    for node in model.graph.node:
        for i, n in enumerate(node.input):
            if n in rename:
                node.input[i] = rename[n]
    save_onnx(model, onnx_path)
    for f in old_files - {onnx_path.name + ".data"}:
        (onnx_path.parent / f).unlink(missing_ok=True)
    return len(rename)


EXTERNAL_DATA_BYTES = 1_500_000_000


def save_onnx(model: Any, path: Path) -> None:
    """onnx.save, with the weights in `<name>.data` beside it when they would push the protobuf
    towards its 2 GB limit."""
    import onnx

    weight_bytes = sum(len(i.raw_data) for i in model.graph.initializer)
    big = weight_bytes > EXTERNAL_DATA_BYTES
    if big:
        (path.parent / (path.name + ".data")).unlink(missing_ok=True)
    onnx.save(model, str(path), save_as_external_data=big, all_tensors_to_one_file=True,
              location=path.name + ".data" if big else None, size_threshold=1024)


def _digest(a: np.ndarray) -> str:
    return hashlib.sha1(str(a.shape).encode() + a.tobytes()).hexdigest()


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
        elif node.op_type == "Gather" and node.input and node.input[0] in inits and len(inits[node.input[0]]) == 2:
            embed.append(node.name)
    return backbone, head, embed


def build_sim(onnx_path: Path, settings: dict[str, Any], tmp: Path, threads: int,
              providers: list[str] | None = None) -> tuple[Any, dict[str, int]]:
    import onnx
    from aimet_onnx import QSpec, QuantizationSimModel
    from aimet_onnx.common.defs import qtype
    from aimet_onnx.quantsim import set_param_type

    wbits = int(settings.get("weight_bits", 4))
    abits = int(settings.get("activation_bits", 16))
    kvbits = int(settings.get("kv_bits", 8))
    model = onnx.load(str(onnx_path))
    backbone, head, embed = _weight_nodes(model)
    kv = [i.name for i in model.graph.input if i.name.startswith("past_")]
    kv += [o.name for o in model.graph.output if o.name.startswith("past_")]
    sim = QuantizationSimModel(model, param_type=qtype.int(8), activation_type=qtype.int(abits),
                               quant_scheme="min_max", config_file="htp_v75", path=str(tmp),
                               providers=providers or ["CPUExecutionProvider"],
                               session_options_kwargs={"intra_op_num_threads": threads})
    del model
    if backbone:
        set_param_type(sim, QSpec.lpbq(qtype.int(wbits), block_size=64, scale_bits=4), nodes_to_include=set(backbone),
                       strict=False)
    if head:
        set_param_type(sim, qtype.int(8), nodes_to_include=set(head), strict=False)
    if kv:
        sim.set_tensor_precision(kv, qtype.int(kvbits), strict=False)
    counts = {"backbone_weights": len(backbone), "lm_head_weights": len(head), "embedding_weights": len(embed),
              "kv_tensors": len(kv), "cuda": int("CUDAExecutionProvider" in (providers or []))}
    return sim, counts


def count_encodings(enc_path: Path) -> dict[str, int]:
    data = json.loads(enc_path.read_text())
    params = data.get("param_encodings", [])
    acts = data.get("activation_encodings", [])
    lpbq = sum(1 for p in params if isinstance(p, dict) and p.get("enc_type") == "LPBQ")
    return {"param_encodings": len(params), "activation_encodings": len(acts), "lpbq_weight_encodings": lpbq,
            "int4_lpbq_weight_encodings": sum(1 for p in params if isinstance(p, dict)
                                              and p.get("enc_type") == "LPBQ" and p.get("compressed_bw") == 4)}


FeedFactory = Callable[[], Iterator[dict[str, np.ndarray]]]


def ort_providers(log: Callable[[str], None] | None = None) -> list[str]:
    """CUDAExecutionProvider when the installed onnxruntime has it (onnxruntime-gpu), else CPU."""
    import onnxruntime as ort

    avail = ort.get_available_providers()
    prov = ["CUDAExecutionProvider", "CPUExecutionProvider"] if "CUDAExecutionProvider" in avail \
        else ["CPUExecutionProvider"]
    if log is not None:
        log(f"onnxruntime providers: {', '.join(prov)} (available: {', '.join(avail)})")
    return prov


def quantize_graph(float_onnx: Path, graph_dir: Path, sim_onnx: Path, feeds: FeedFactory, n_feeds: int,
                   settings: dict[str, Any], name: str, progress: ProgressFn, threads: int,
                   freeze_from: Path | None = None, providers: list[str] | None = None) -> dict[str, Any]:
    """QuantSim one graph, calibrate on `feeds()` (a generator: one sample in memory at a time),
    export AIMET ONNX + encodings and the QDQ ONNX. Frees the sim."""
    import onnx

    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f"hexq-{name}-"))
    try:
        sim, counts = build_sim(float_onnx, settings, tmp, threads, providers)
        if freeze_from is not None:
            sim.set_and_freeze_param_encodings(str(freeze_from))

        def gen() -> Iterator[dict[str, np.ndarray]]:
            for i, f in enumerate(feeds()):
                progress(name, i, n_feeds)
                yield f
            progress(name, n_feeds, n_feeds)

        sim.compute_encodings(gen())
        graph_dir.mkdir(parents=True, exist_ok=True)
        sim.export(str(graph_dir), "model")
        if int(settings.get("weight_bits", 4)) not in (4, 8, 16):
            # ONNX QuantizeLinear has no such integer type: bake the quantized weights in
            # (weight-only simulation, activations in float) for onnxruntime.
            sim.fold_param_quantizers()
            sim.export(str(tmp), "folded")
            qdq = onnx.load(str(tmp / "folded.onnx"))
        else:
            qdq = sim.to_onnx_qdq()
        del sim
        gc.collect()
        sim_onnx.parent.mkdir(parents=True, exist_ok=True)
        save_onnx(qdq, sim_onnx)
        del qdq
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        gc.collect()
    stats: dict[str, Any] = dict(count_encodings(graph_dir / "model.encodings"))
    stats.update(counts)
    stats["seconds"] = round(time.monotonic() - t0, 2)
    return stats


class RecordFile:
    """Fixed-shape float32 arrays appended to a flat file and read back one at a time with
    np.fromfile (no memory map: pages read do not stay in the process's RSS)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.shape: tuple[int, ...] | None = None
        self.count = 0
        self._fh: Any = None

    def append(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=np.float32)
        if self.shape is None:
            self.shape = tuple(a.shape)
            self._fh = open(self.path, "wb")  # noqa: SIM115 (closed in close())
        elif tuple(a.shape) != self.shape:
            raise ValueError(f"{self.path.name}: shape {a.shape} != {self.shape}")
        self._fh.write(a.tobytes())
        self.count += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __getitem__(self, i: int) -> np.ndarray:
        assert self.shape is not None and 0 <= i < self.count
        n = int(np.prod(self.shape))
        return np.fromfile(self.path, dtype=np.float32, count=n, offset=4 * n * i).reshape(self.shape)

    def __len__(self) -> int:
        return self.count

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def run_to_disk(path: Path, feeds: FeedFactory, threads: int, store: Path, tag: str, layers: list[int],
                keep_hidden: bool, keep_kv: bool, providers: list[str] | None = None
                ) -> tuple[RecordFile | None, dict[int, tuple[RecordFile, RecordFile]]]:
    """Run a (QDQ) graph over the feeds one at a time; write its hidden-state output and/or its new
    KV entries to record files under `store` (the stage's partial folder), never all in memory."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=providers or ["CPUExecutionProvider"])
    hidden = RecordFile(store / f"{tag}_hidden.f32") if keep_hidden else None
    kv = {li: (RecordFile(store / f"{tag}_k{li}.f32"), RecordFile(store / f"{tag}_v{li}.f32"))
          for li in layers} if keep_kv else {}
    for f in feeds():
        outs = sess.run(None, f)  # by position: QuantSim renames outputs
        if hidden is not None:
            hidden.append(outs[0])
        for i, li in enumerate(layers):
            if li in kv:
                kv[li][0].append(outs[1 + 2 * i])
                kv[li][1].append(outs[2 + 2 * i])
        del outs
    del sess
    for r in ([hidden] if hidden is not None else []) + [x for pair in kv.values() for x in pair]:
        r.close()
    return hidden, kv


def pp_feed_factory(part_first: bool, layers: list[int], blocks: list[Block], hidden_in: RecordFile | None,
                    s: int, cl: int, kvh: int, hd: int) -> FeedFactory:
    def feeds() -> Iterator[dict[str, np.ndarray]]:
        zk: np.ndarray = np.zeros((1, kvh, hd, cl - s), np.float32)
        zv: np.ndarray = np.zeros((1, kvh, cl - s, hd), np.float32)
        for b, blk in enumerate(blocks):
            f: dict[str, np.ndarray] = {}
            if part_first:
                f["input_ids"] = np.asarray([blk.ids], dtype=np.int32)
            else:
                assert hidden_in is not None
                f["hidden_states_in"] = hidden_in[b]
            f["attention_mask"] = pp_mask(s, cl, blk.n_valid)
            f["position_ids"] = (np.arange(s, dtype=np.int32) + blk.start_pos)[None]
            for li in layers:
                f[f"past_key_{li}_in"] = zk
                f[f"past_value_{li}_in"] = zv
            yield f
    return feeds


def tg_sample_positions(blocks: list[Block], per_block: int) -> list[tuple[int, int]]:
    """(block index, position) of every token-generator calibration sample."""
    return [(b, p) for b, blk in enumerate(blocks) for p in tg_positions(blk.n_valid, per_block)]


def tg_feed_factory(part_first: bool, layers: list[int], blocks: list[Block],
                    pp_kv: dict[int, tuple[RecordFile, RecordFile]], hidden_in: RecordFile | None,
                    cl: int, kvh: int, hd: int, per_block: int) -> FeedFactory:
    """Token-generator samples, built one at a time: one token at position p with the (quantized)
    prompt processor's KV of tokens < p, read back from disk."""
    def feeds() -> Iterator[dict[str, np.ndarray]]:
        for j, (b, p) in enumerate(tg_sample_positions(blocks, per_block)):
            blk = blocks[b]
            f: dict[str, np.ndarray] = {}
            if part_first:
                f["input_ids"] = np.asarray([[blk.ids[p]]], dtype=np.int32)
            else:
                assert hidden_in is not None
                f["hidden_states_in"] = hidden_in[j]
            f["attention_mask"] = tg_mask(cl, p)
            f["position_ids"] = np.asarray([[blk.start_pos + p]], dtype=np.int32)
            for li in layers:
                k_new, v_new = pp_kv[li][0][b], pp_kv[li][1][b]
                pk: np.ndarray = np.zeros((1, kvh, hd, cl - 1), np.float32)
                pv: np.ndarray = np.zeros((1, kvh, cl - 1, hd), np.float32)
                pk[..., :p] = k_new[..., :p]
                pv[:, :, :p] = v_new[:, :, :p]
                f[f"past_key_{li}_in"] = pk
                f[f"past_value_{li}_in"] = pv
            yield f
    return feeds


def quantize_partwise(graphs: list[dict[str, Any]], base: Path, blocks: list[Block], settings: dict[str, Any],
                      dims: dict[str, int], progress: ProgressFn, log: Callable[[str], None],
                      threads: int = 2, tg_per_block: int = 4, providers: list[str] | None = None
                      ) -> list[dict[str, Any]]:
    """Quantize every part in order; fills in each graph entry's onnx/encodings/sim_onnx and stats.
    `graphs` entries carry float_onnx relative to `base` (the stage's out_dir).

    Memory: one graph's QuantSim at a time; calibration samples are generated one at a time; part
    k's quantized outputs (hidden states for part k+1, the prompt processor's KV for the token
    generator's samples) go to record files in base/calib.tmp, removed at the end."""
    cl, kvh, hd = dims["context_length"], dims["num_kv_heads"], dims["head_dim"]
    parts = sorted({g["part"] for g in graphs})
    store = base / "calib.tmp"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    n_tg = len(tg_sample_positions(blocks, tg_per_block))
    pp_hidden: RecordFile | None = None
    tg_hidden: RecordFile | None = None
    try:
        for k in parts:
            pp = next(g for g in graphs if g["part"] == k and g["kind"] == "prompt_processor")
            tg = next((g for g in graphs if g["part"] == k and g["kind"] == "token_generator"), None)
            first, last = k == parts[0], k == parts[-1]
            layers = list(pp["layers"])
            s = int(pp["seq_len"])
            feeds = pp_feed_factory(first, layers, blocks, pp_hidden, s, cl, kvh, hd)
            log(f"part {k}: calibrating {pp['name']} on {len(blocks)} samples")
            pp["onnx"] = f"parts/{pp['name']}/model.onnx"
            pp["encodings"] = f"parts/{pp['name']}/model.encodings"
            pp["sim_onnx"] = f"sim/{pp['name']}.onnx"
            pp["stats"] = quantize_graph(base / pp["float_onnx"], base / "parts" / pp["name"], base / pp["sim_onnx"],
                                         feeds, len(blocks), settings, pp["name"], progress, threads,
                                         providers=providers)
            # quantized outputs: hidden states feed part k+1, the KV feeds this part's token generator
            new_pp_hidden, pp_kv = run_to_disk(base / pp["sim_onnx"], feeds, threads, store, f"p{k}_pp", layers,
                                               keep_hidden=not last, keep_kv=tg is not None, providers=providers)
            if tg is not None:
                tfeeds = tg_feed_factory(first, layers, blocks, pp_kv, tg_hidden, cl, kvh, hd, tg_per_block)
                log(f"part {k}: calibrating {tg['name']} on {n_tg} samples (weights frozen from {pp['name']})")
                tg["onnx"] = f"parts/{tg['name']}/model.onnx"
                tg["encodings"] = f"parts/{tg['name']}/model.encodings"
                tg["sim_onnx"] = f"sim/{tg['name']}.onnx"
                tg["stats"] = quantize_graph(base / tg["float_onnx"], base / "parts" / tg["name"],
                                             base / tg["sim_onnx"], tfeeds, n_tg, settings, tg["name"], progress,
                                             threads, freeze_from=base / pp["encodings"], providers=providers)
                new_tg_hidden = None
                if not last:
                    new_tg_hidden, _ = run_to_disk(base / tg["sim_onnx"], tfeeds, threads, store, f"p{k}_tg", layers,
                                                   keep_hidden=True, keep_kv=False, providers=providers)
                if tg_hidden is not None:
                    tg_hidden.delete()
                tg_hidden = new_tg_hidden
            for kr, vr in pp_kv.values():
                kr.delete()
                vr.delete()
            if pp_hidden is not None:
                pp_hidden.delete()
            pp_hidden = new_pp_hidden
            gc.collect()
    finally:
        shutil.rmtree(store, ignore_errors=True)
    return graphs


def shared_weight_check(graphs: list[dict[str, Any]], base: Path) -> dict[str, Any]:
    """Count weight encodings that differ between the two graphs of each part (must be 0)."""
    result: dict[str, Any] = {}
    for g in graphs:
        if g["kind"] != "prompt_processor":
            continue
        t = next((x for x in graphs if x["part"] == g["part"] and x["kind"] == "token_generator"), None)
        if t is None:
            continue
        a = {p["name"]: p for p in json.loads((base / g["encodings"]).read_text())["param_encodings"]}
        b = {p["name"]: p for p in json.loads((base / t["encodings"]).read_text())["param_encodings"]}
        common = set(a) & set(b)
        diff = sum(1 for n in common if a[n] != b[n])
        result[f"part_{g['part']}"] = {"shared": len(common), "different": diff,
                                       "only_prompt": len(set(a) - set(b)), "only_token": len(set(b) - set(a))}
    return result
