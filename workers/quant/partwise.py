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
    by content (also transposed), so both graphs of a part name the same weight the same way."""
    import onnx
    from onnx import numpy_helper

    index: dict[str, str] = {}
    for name, arr in named.items():
        a = np.ascontiguousarray(arr, dtype=np.float32)
        index[_digest(a)] = name
        if a.ndim == 2:
            index[_digest(np.ascontiguousarray(a.T))] = name
    model = onnx.load(str(onnx_path))
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
    if not rename:
        return 0
    for init in model.graph.initializer:
        if init.name in rename:
            init.name = rename[init.name]
    for node in model.graph.node:
        for i, n in enumerate(node.input):
            if n in rename:
                node.input[i] = rename[n]
    onnx.save(model, str(onnx_path))
    return len(rename)


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


def build_sim(onnx_path: Path, settings: dict[str, Any], tmp: Path, threads: int) -> tuple[Any, dict[str, int]]:
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
              "kv_tensors": len(kv)}
    return sim, counts


def count_encodings(enc_path: Path) -> dict[str, int]:
    data = json.loads(enc_path.read_text())
    params = data.get("param_encodings", [])
    acts = data.get("activation_encodings", [])
    lpbq = sum(1 for p in params if isinstance(p, dict) and p.get("enc_type") == "LPBQ")
    return {"param_encodings": len(params), "activation_encodings": len(acts), "lpbq_weight_encodings": lpbq,
            "int4_lpbq_weight_encodings": sum(1 for p in params if isinstance(p, dict)
                                              and p.get("enc_type") == "LPBQ" and p.get("compressed_bw") == 4)}


def quantize_graph(float_onnx: Path, graph_dir: Path, sim_onnx: Path, feeds: list[dict[str, np.ndarray]],
                   settings: dict[str, Any], name: str, progress: ProgressFn, threads: int,
                   freeze_from: Path | None = None) -> dict[str, Any]:
    """QuantSim one graph, calibrate, export AIMET ONNX + encodings and the QDQ ONNX. Frees the sim."""
    import onnx

    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f"hexq-{name}-"))
    try:
        sim, counts = build_sim(float_onnx, settings, tmp, threads)
        if freeze_from is not None:
            sim.set_and_freeze_param_encodings(str(freeze_from))

        def gen() -> Iterator[dict[str, np.ndarray]]:
            for i, f in enumerate(feeds):
                progress(name, i, len(feeds))
                yield f
            progress(name, len(feeds), len(feeds))

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
        big = qdq.ByteSize() > 1_500_000_000 if hasattr(qdq, "ByteSize") else False
        onnx.save(qdq, str(sim_onnx), save_as_external_data=big,
                  location=sim_onnx.name + ".data" if big else None)
        del qdq
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        gc.collect()
    stats: dict[str, Any] = dict(count_encodings(graph_dir / "model.encodings"))
    stats.update(counts)
    stats["seconds"] = round(time.monotonic() - t0, 2)
    return stats


def run_onnx(path: Path, feeds: list[dict[str, np.ndarray]], threads: int) -> list[list[np.ndarray]]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    outs = [list(sess.run(None, f)) for f in feeds]
    del sess
    return outs


def part_feeds(part_first: bool, layers: list[int], blocks: list[Block], hidden_in: list[np.ndarray] | None,
               s: int, cl: int, kvh: int, hd: int) -> list[dict[str, np.ndarray]]:
    zk: np.ndarray = np.zeros((1, kvh, hd, cl - s), np.float32)
    zv: np.ndarray = np.zeros((1, kvh, cl - s, hd), np.float32)
    feeds = []
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
        feeds.append(f)
    return feeds


def tg_feeds(part_first: bool, layers: list[int], blocks: list[Block], pp_outs: list[list[np.ndarray]],
             hidden_in: list[np.ndarray] | None, cl: int, kvh: int, hd: int, per_block: int
             ) -> list[dict[str, np.ndarray]]:
    """Token-generator samples: one token at position p with the prompt processor's KV of tokens < p."""
    feeds = []
    j = 0
    for b, blk in enumerate(blocks):
        for p in tg_positions(blk.n_valid, per_block):
            f: dict[str, np.ndarray] = {}
            if part_first:
                f["input_ids"] = np.asarray([[blk.ids[p]]], dtype=np.int32)
            else:
                assert hidden_in is not None
                f["hidden_states_in"] = hidden_in[j]
            f["attention_mask"] = tg_mask(cl, p)
            f["position_ids"] = np.asarray([[blk.start_pos + p]], dtype=np.int32)
            for i, li in enumerate(layers):
                k_new, v_new = pp_outs[b][1 + 2 * i], pp_outs[b][2 + 2 * i]
                pk: np.ndarray = np.zeros((1, kvh, hd, cl - 1), np.float32)
                pv: np.ndarray = np.zeros((1, kvh, cl - 1, hd), np.float32)
                pk[..., :p] = k_new[..., :p]
                pv[:, :, :p] = v_new[:, :, :p]
                f[f"past_key_{li}_in"] = pk
                f[f"past_value_{li}_in"] = pv
            feeds.append(f)
            j += 1
    return feeds


def quantize_partwise(graphs: list[dict[str, Any]], base: Path, blocks: list[Block], settings: dict[str, Any],
                      dims: dict[str, int], progress: ProgressFn, log: Callable[[str], None],
                      threads: int = 2, tg_per_block: int = 4) -> list[dict[str, Any]]:
    """Quantize every part in order; fills in each graph entry's onnx/encodings/sim_onnx and stats.
    `graphs` entries carry float_onnx relative to `base` (the stage's out_dir)."""
    cl, kvh, hd = dims["context_length"], dims["num_kv_heads"], dims["head_dim"]
    parts = sorted({g["part"] for g in graphs})
    pp_hidden: list[np.ndarray] | None = None
    tg_hidden: list[np.ndarray] | None = None
    for k in parts:
        pp = next(g for g in graphs if g["part"] == k and g["kind"] == "prompt_processor")
        tg = next((g for g in graphs if g["part"] == k and g["kind"] == "token_generator"), None)
        first = k == parts[0]
        layers = list(pp["layers"])
        s = int(pp["seq_len"])
        feeds = part_feeds(first, layers, blocks, pp_hidden, s, cl, kvh, hd)
        log(f"part {k}: calibrating {pp['name']} on {len(feeds)} samples")
        pp["onnx"] = f"parts/{pp['name']}/model.onnx"
        pp["encodings"] = f"parts/{pp['name']}/model.encodings"
        pp["sim_onnx"] = f"sim/{pp['name']}.onnx"
        pp["stats"] = quantize_graph(base / pp["float_onnx"], base / "parts" / pp["name"], base / pp["sim_onnx"],
                                     feeds, settings, pp["name"], progress, threads)
        outs = run_onnx(base / pp["sim_onnx"], feeds, threads)   # quantized outputs feed part k+1
        del feeds
        if tg is not None:
            tfeeds = tg_feeds(first, layers, blocks, outs, tg_hidden, cl, kvh, hd, tg_per_block)
            log(f"part {k}: calibrating {tg['name']} on {len(tfeeds)} samples (weights frozen from {pp['name']})")
            tg["onnx"] = f"parts/{tg['name']}/model.onnx"
            tg["encodings"] = f"parts/{tg['name']}/model.encodings"
            tg["sim_onnx"] = f"sim/{tg['name']}.onnx"
            tg["stats"] = quantize_graph(base / tg["float_onnx"], base / "parts" / tg["name"], base / tg["sim_onnx"],
                                         tfeeds, settings, tg["name"], progress, threads,
                                         freeze_from=base / pp["encodings"])
            touts = run_onnx(base / tg["sim_onnx"], tfeeds, threads)
            del tfeeds
            tg_hidden = [o[0] for o in touts]
            del touts
        pp_hidden = [o[0] for o in outs]
        del outs
        gc.collect()
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
