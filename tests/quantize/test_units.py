"""Calibration units (one QuantSim per decoder layer) and the streaming QDQ builder, on the built-in model's
float part graphs with real aimet-onnx."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from hexstudio.shared.data import builtin_model_dir
from hexstudio.shared.run_settings import RunSettings
from hexstudio.workers.quant.calib import pp_mask

REPO = Path(__file__).resolve().parents[2]
HF = builtin_model_dir()
CL, AR = 256, 64
HIDDEN, KVH, HD = 256, 2, 64


@pytest.fixture(scope="module")
def float_parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from hexstudio.workers.export import export_deployment_graphs

    out = tmp_path_factory.mktemp("float")
    graphs = export_deployment_graphs(
        HF, out / "float", context_length=CL, ar_n=AR, parts=2, kinds=("prompt_processor",)
    )
    return {g["name"]: out / g["float_onnx"] for g in graphs}


def _feed(model_inputs: list[str], rng: np.random.Generator) -> dict[str, np.ndarray]:
    f: dict[str, np.ndarray] = {}
    for n in model_inputs:
        if n == "input_ids":
            f[n] = rng.integers(6, 800, (1, AR)).astype(np.int32)
        elif n == "attention_mask":
            f[n] = pp_mask(AR, CL, AR)
        elif n in ("position_ids_cos", "position_ids_sin"):
            ang = (np.arange(AR) + 3)[:, None] * 500000.0 ** (-np.arange(HD // 2) / (HD // 2))
            f[n] = (np.cos(ang) if n.endswith("cos") else np.sin(ang)).astype(np.float32)[None, None]
        elif n.startswith("past_key_"):
            f[n] = (0.5 * rng.standard_normal((KVH, 1, HD, CL - AR))).astype(np.float32)
        elif n.startswith("past_value_"):
            f[n] = (0.5 * rng.standard_normal((KVH, 1, CL - AR, HD))).astype(np.float32)
        else:  # the previous part's output (the boundary tensor)
            f[n] = rng.standard_normal((1, AR, HIDDEN)).astype(np.float32)
    return f


def _inputs(path: Path) -> list[str]:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    return [i.name for i in m.graph.input if i.name not in inits]


def _run(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feed), strict=True))


def test_part_graph_cuts_into_one_unit_per_layer(float_parts: dict[str, Path], tmp_path: Path) -> None:
    from hexstudio.workers.quant.units import split_units

    first = split_units(float_parts["prompt_ar64_cl256_1_of_2"], tmp_path, "a")
    last = split_units(float_parts["prompt_ar64_cl256_2_of_2"], tmp_path, "b")
    assert [u.label for u in first] == ["embedding", "layer 0", "layer 1"]
    assert [u.label for u in last] == ["layer 2", "layer 3", "lm_head"]
    assert first[0].inputs[0] == "input_ids" and "_model_model_layers_1_Add_1_output_0" in first[-1].outputs
    assert [u.layers for u in last] == [[2], [3], []] and "logits" in last[-1].outputs
    # each unit holds only its own weights
    import onnx

    for u in first[1:]:
        m = onnx.load(str(u.path), load_external_data=False)
        big = {i.name for i in m.graph.initializer if len(i.dims) == 2}
        assert big and all(f"layers.{u.level}." in n for n in big), (u.label, big)
    # the units run in sequence reproduce the part graph exactly (float)
    rng = np.random.default_rng(0)
    feed = _feed(_inputs(float_parts["prompt_ar64_cl256_1_of_2"]), rng)
    whole = _run(float_parts["prompt_ar64_cl256_1_of_2"], feed)
    values = dict(feed)
    for u in first:
        values.update(_run(u.path, {n: values[n] for n in u.inputs}))
    for name, v in whole.items():
        np.testing.assert_allclose(values[name], v, rtol=1e-5, atol=1e-5)


def test_streamed_qdq_graph_matches_aimet_to_onnx_qdq(float_parts: dict[str, Path], tmp_path: Path) -> None:
    """The simulation graph built one weight at a time from the encodings computes what aimet-onnx's own
    QDQ export computes (LPBQ int4 backbone, int8 lm_head, int16 activations, int8 KV)."""
    import onnx

    from hexstudio.workers.quant.partwise import build_sim, save_baked
    from hexstudio.workers.quant.qdq import build_qdq

    path = float_parts["prompt_ar64_cl256_2_of_2"]
    rng = np.random.default_rng(1)
    names = _inputs(path)
    sim, _ = build_sim(path, RunSettings(weight_bits=4), Path(tempfile.mkdtemp(dir=tmp_path)), 2)
    sim.compute_encodings(iter([_feed(names, rng) for _ in range(2)]))
    sim.export(str(tmp_path), "model", export_model=False)
    assert save_baked(sim, tmp_path / "baked.safetensors") >= 8
    onnx.save(sim.to_onnx_qdq(), str(tmp_path / "aimet.onnx"))
    del sim
    counts = build_qdq(
        path, tmp_path / "model.encodings", [tmp_path / "baked.safetensors"], tmp_path / "mine.onnx"
    )
    assert counts["baked_weights"] >= 8 and counts["activation_qdq"] > 50
    feed = _feed(names, rng)
    ref, mine, flt = _run(tmp_path / "aimet.onnx", feed), _run(tmp_path / "mine.onnx", feed), _run(path, feed)
    # the weights are AIMET's, bit for bit (aimet's QDQ graph keeps each weight's quantize-dequantized value)
    import onnx
    from onnx import numpy_helper

    theirs = {
        i.name: numpy_helper.to_array(i, base_dir=str(tmp_path))
        for i in onnx.load(str(tmp_path / "aimet.onnx")).graph.initializer
    }
    ours = {
        i.name: numpy_helper.to_array(i, base_dir=str(tmp_path))
        for i in onnx.load(str(tmp_path / "mine.onnx")).graph.initializer
    }
    weights = [n for n in ours if n.startswith(("model.", "lm_head")) and ours[n].ndim == 2 and "__" not in n]
    assert len(weights) >= 8
    # stored as integers with their scales (LPBQ: int4 with block scales; the lm_head: int8 per channel); they
    # dequantize to AIMET's values within a few ulps (AIMET rounds the LPBQ block scale its own way)
    from hexstudio.workers.quant.qdq import MAX_ULPS, dequantize_weight

    mine_model = onnx.load(str(tmp_path / "mine.onnx"), load_external_data=False)
    types = {i.name: i.data_type for i in mine_model.graph.initializer}
    assert types["lm_head.weight"] == onnx.TensorProto.INT8
    assert sum(1 for n in weights if types[n] == onnx.TensorProto.INT4) >= 7
    for n in weights:
        deq = dequantize_weight(mine_model, n, tmp_path)
        ulps = np.abs(deq - theirs[n]) / np.spacing(np.maximum(np.abs(theirs[n]), np.float32(1e-30)))
        assert float(ulps.max()) <= MAX_ULPS, n
    # the outputs agree but for rare one-step flips of 16-bit activations: aimet's graph feeds each weight
    # through a runtime DequantizeLinear, ours holds it constant, so onnxruntime sums in another order; a flip
    # upstream of an 8-bit KV step is one coarse step there
    for name in ref:
        quant_err = float(np.abs(ref[name] - flt[name]).mean())
        assert quant_err > 0, name  # the graphs are really quantized
        # measured 0.03-0.10 of the quantization error (an encoding or weight read wrongly is of its order)
        assert float(np.abs(ref[name] - mine[name]).mean()) <= 0.15 * quant_err, name


def test_unit_encodings_merge_back_into_the_part(float_parts: dict[str, Path], tmp_path: Path) -> None:
    from hexstudio.workers.quant.units import merge_encodings

    a = tmp_path / "a.encodings"
    b = tmp_path / "b.encodings"
    enc = {"version": "1.0.0", "quantizer_args": {}, "producer": {}}
    a.write_text(
        json.dumps(
            {
                **enc,
                "activation_encodings": [{"name": "x", "scale": [1.0]}],
                "param_encodings": [{"name": "w0", "scale": [2.0]}],
            }
        )
    )
    b.write_text(
        json.dumps(
            {
                **enc,
                "activation_encodings": [{"name": "x", "scale": [9.0]}, {"name": "y", "scale": [3.0]}],
                "param_encodings": [{"name": "w1", "scale": [4.0]}],
            }
        )
    )
    counts = merge_encodings([a, b], tmp_path / "part.encodings")
    doc = json.loads((tmp_path / "part.encodings").read_text())
    assert counts == {"activation_encodings": 2, "param_encodings": 2}
    # a tensor two units encode (produced by one, read by the next) keeps the producer's encoding
    assert {x["name"]: x["scale"] for x in doc["activation_encodings"]} == {"x": [1.0], "y": [3.0]}
    assert doc["version"] == "1.0.0" and not (tmp_path / "part.encodings.tmp").exists()


def test_lm_head_cuts_into_column_chunks_that_calibrate_like_the_whole(
    float_parts: dict[str, Path], tmp_path: Path
) -> None:
    """The lm_head unit cut by vocabulary columns (as an 8B's 525M-parameter head is, to the size of a
    decoder layer): the chunks compute the whole unit's logits, their per-channel weight encodings and
    quantized weights are the whole unit's, and the merged logits range is the whole unit's."""
    from safetensors.numpy import load_file

    from hexstudio.workers.quant.partwise import baked_path, quantize_unit
    from hexstudio.workers.quant.units import merge_column_chunks, split_units

    path = float_parts["prompt_ar64_cl256_2_of_2"]
    whole = split_units(path, tmp_path / "whole", "w")[-1]
    chunks = [u for u in split_units(path, tmp_path / "cut", "c", head_chunk_params=80_000) if u.columns]
    assert whole.label == "lm_head" and whole.params == HIDDEN * 840
    assert [u.columns for u in chunks] == [(0, 280), (280, 560), (560, 840)]
    assert chunks[0].label == "lm_head columns 0-279" and all(u.params <= 80_000 for u in chunks)
    rng = np.random.default_rng(3)
    hidden = [(2.0 * rng.standard_normal((1, AR, HIDDEN))).astype(np.float32) for _ in range(3)]

    def feeds(u: object = None) -> object:
        return iter([{whole.inputs[0]: h} for h in hidden])

    ref = _run(whole.path, {whole.inputs[0]: hidden[0]})["logits"]
    got = np.concatenate([_run(u.path, {u.inputs[0]: hidden[0]})["logits"] for u in chunks], axis=-1)
    np.testing.assert_array_equal(got, ref)

    quantize_unit(whole, tmp_path / "whole.encodings", feeds, RunSettings(), 2)
    encs = []
    for u in chunks:
        encs.append(tmp_path / f"c{u.index}.encodings")
        quantize_unit(u, encs[-1], feeds, RunSettings(), 2)
    merge_column_chunks(chunks, encs, tmp_path / "head.encodings")
    a = json.loads((tmp_path / "whole.encodings").read_text())
    b = json.loads((tmp_path / "head.encodings").read_text())
    pa = {p["name"]: p for p in a["param_encodings"]}
    pb = {p["name"]: p for p in b["param_encodings"]}
    assert pa.keys() == pb.keys() == {"lm_head.weight"}
    assert pa["lm_head.weight"]["enc_type"] == "PER_CHANNEL" and pa["lm_head.weight"]["bw"] == 8
    assert pb["lm_head.weight"] == pa["lm_head.weight"]
    la = next(x for x in a["activation_encodings"] if x["name"] == "logits")
    lb = next(x for x in b["activation_encodings"] if x["name"] == "logits")
    assert {k: v for k, v in la.items() if k not in ("scale", "offset")} == {
        k: v for k, v in lb.items() if k not in ("scale", "offset")
    }
    assert lb["scale"][0] == pytest.approx(la["scale"][0], rel=1e-4)
    assert abs(lb["offset"][0] - la["offset"][0]) <= 1
    whole_baked = load_file(str(baked_path(tmp_path / "whole.encodings")))["lm_head.weight"]
    merged_baked = load_file(str(baked_path(tmp_path / "head.encodings")))["lm_head.weight"]
    np.testing.assert_array_equal(merged_baked, whole_baked)


def test_embedding_keeps_only_the_calibration_tokens_rows(
    float_parts: dict[str, Path], tmp_path: Path
) -> None:
    """The embedding unit's table cut to the rows of the tokens the samples hold (and the rows of its
    extremes): same outputs, the same encodings (the table's own 16-bit range included) and the same
    quantized table for the simulation graph as the whole table; a token outside the kept rows is an
    error, not a silent wrong row."""
    import onnx

    from hexstudio.workers.quant.partwise import quantize_unit
    from hexstudio.workers.quant.units import remap_ids, split_units

    path = float_parts["prompt_ar64_cl256_1_of_2"]
    rng = np.random.default_rng(4)
    names = _inputs(path)
    samples = [_feed(names, rng) for _ in range(3)]
    ids = np.unique(np.concatenate([f["input_ids"].ravel() for f in samples]))
    whole = split_units(path, tmp_path / "whole", "w")[0]
    small = split_units(path, tmp_path / "small", "s", vocab_ids=ids)[0]
    assert whole.label == "embedding"
    table = next(
        i
        for i in onnx.load(str(small.path), load_external_data=False).graph.initializer
        if i.name == small.table
    )
    kept = small.vocab_rows
    assert kept is not None and set(ids) <= set(kept) and len(kept) <= len(ids) + 2
    assert small.label == f"embedding ({len(kept)} of 840 rows)"
    assert list(table.dims) == [len(kept), HIDDEN] and small.params == len(kept) * HIDDEN < whole.params

    def feeds() -> object:
        return iter([{n: f[n] for n in whole.inputs} for f in samples])

    remapped = remap_ids(feeds, kept)
    for f, g in zip(feeds(), remapped(), strict=True):
        ra, rb = _run(whole.path, f), _run(small.path, g)
        for k in ra:
            np.testing.assert_array_equal(rb[k], ra[k])
    quantize_unit(whole, tmp_path / "whole.encodings", feeds, RunSettings(), 2)
    quantize_unit(small, tmp_path / "small.encodings", remapped, RunSettings(), 2)
    a = json.loads((tmp_path / "whole.encodings").read_text())
    b = json.loads((tmp_path / "small.encodings").read_text())
    assert a["param_encodings"] == b["param_encodings"]
    assert {x["name"]: x for x in a["activation_encodings"]} == {
        x["name"]: x for x in b["activation_encodings"]
    }
    assert any(x["name"] == small.table for x in a["activation_encodings"] + a["param_encodings"])
    from safetensors.numpy import load_file

    from hexstudio.workers.quant.partwise import baked_path

    wa = load_file(str(baked_path(tmp_path / "whole.encodings")))
    wb = load_file(str(baked_path(tmp_path / "small.encodings")))
    assert wa.keys() == wb.keys() and small.table in wa
    for k in wa:
        np.testing.assert_array_equal(wb[k], wa[k], err_msg=k)

    def stray() -> object:
        return iter(
            [
                {
                    **samples[0],
                    "input_ids": np.full((1, AR), int(np.setdiff1d(np.arange(840), kept)[0]), np.int32),
                }
            ]
        )

    with pytest.raises(ValueError, match="token id the compacted embedding does not"):
        next(iter(remap_ids(stray, kept)()))


def test_partwise_quantization_with_a_chunked_lm_head(tmp_path: Path) -> None:
    """The whole part-wise pipeline with the lm_head calibrated in column chunks: both graphs of the last
    part carry one per-channel lm_head encoding over the whole vocabulary, frozen from the prompt
    processor's calibration, which the token generator shares (one encodings file per part), and the
    simulation graphs run."""
    import onnxruntime as ort

    from hexstudio.workers.export import export_deployment_graphs
    from hexstudio.workers.quant.calib import BUILTIN_TEXT, blocks_from_windows, token_windows
    from hexstudio.workers.quant.partwise import quantize_partwise, shared_weight_check

    graphs = export_deployment_graphs(HF, tmp_path / "float", context_length=CL, ar_n=AR, parts=2)
    blocks = blocks_from_windows(token_windows(HF, BUILTIN_TEXT / "calibration.txt", 2, AR), AR)
    lines: list[str] = []
    from hexstudio.shared.rope import genie_positional_encoding, genie_rope_tables

    pe = genie_positional_encoding(json.loads((HF / "config.json").read_text()), CL)
    quantize_partwise(
        graphs,
        tmp_path,
        blocks,
        RunSettings(),
        {"context_length": CL, "num_kv_heads": KVH, "head_dim": HD},
        lambda *a: None,
        lines.append,
        rope=genie_rope_tables(pe, CL),
        head_chunk_params=80_000,
    )
    assert any("lm_head columns 560-839" in line for line in lines)
    assert any("embedding (" in line and " of 840 rows)" in line for line in lines)
    assert all(v["different"] == 0 for v in shared_weight_check(graphs, tmp_path).values())
    for g in graphs:
        enc = json.loads((tmp_path / g["encodings"]).read_text())
        if g["part"] == 2:
            head = [p for p in enc["param_encodings"] if p["name"] == "lm_head.weight"]
            assert len(head) == 1 and len(head[0]["scale"]) == 840 and g["stats"]["lm_head_weights"] == 1
            assert g["stats"]["calibration_units"] == 5  # 2 layers + 3 chunks
            assert [a["name"] for a in enc["activation_encodings"]].count("logits") == 1
        sess = ort.InferenceSession(str(tmp_path / g["sim_onnx"]), providers=["CPUExecutionProvider"])
        assert sess.get_outputs()
    assert not (tmp_path / "calib.tmp").exists()


def test_integer_weights_written_a_block_of_rows_at_a_time_equal_the_whole() -> None:
    """qdq.to_ints on row blocks (what build_qdq does for large weights) gives the whole weight's integers:
    int4 with block scales (packed two per byte) and int8 per channel."""
    from hexstudio.workers.quant.qdq import IntForm, to_ints

    rng = np.random.default_rng(3)
    rows, cols, block = 256, 6, 64
    for form in (
        IntForm(rng.uniform(0.01, 0.1, (rows // block, cols)).astype(np.float32), 0, block),
        IntForm(rng.uniform(0.01, 0.1, cols).astype(np.float32), 1),
    ):
        lo, hi = (-8, 8) if form.block else (-128, 128)
        q = rng.integers(lo, hi, (rows, cols)).astype(np.float32)
        w = (q * form.expand((rows, cols))).astype(np.float32)
        whole = to_ints("w", w, form)
        pieces = np.concatenate([to_ints("w", w[r0 : r0 + 128], form, r0) for r0 in range(0, rows, 128)])
        np.testing.assert_array_equal(pieces, whole)
        if form.block:
            lo4 = (whole & 0x0F).astype(np.int16)
            assert np.array_equal(np.where(lo4 > 7, lo4 - 16, lo4), q.reshape(-1)[0::2])


def test_a_gathered_table_quantizes_with_the_one_table_formula(tmp_path: Path) -> None:
    """qdq.table_ints (the simulation graph's embedding integers) is qdq.table_rows (the AI Hub upload's) and
    onnx QuantizeLinear's rounding: half to even, + the zero point -offset, saturated; uint8 / uint16."""
    from onnx import TensorProto

    from hexstudio.workers.quant.qdq import table_ints, table_rows

    rng = np.random.default_rng(5)
    for bw in (8, 16):
        w = (rng.standard_normal((40, 16)) * 0.05).astype(np.float32)
        lo, hi = 0.8 * float(w.min()), 0.8 * float(w.max())  # the ends saturate
        scale = (hi - lo) / ((1 << bw) - 1)
        enc = {"name": "E", "bw": bw, "scale": [scale], "offset": [round(lo / scale)]}
        w[0] = ((np.arange(16) - 8 + 0.5) * np.float32(scale)).astype(np.float32)  # on rounding boundaries
        data = tmp_path / f"t{bw}.data"
        w.tofile(data)
        init = TensorProto(name="E", data_type=TensorProto.FLOAT, dims=list(w.shape))
        init.data_location = TensorProto.EXTERNAL
        for k, v in (("location", data.name), ("offset", "0"), ("length", str(w.nbytes))):
            init.external_data.add(key=k, value=v)
        zp = round(-float(enc["offset"][0]))
        want = np.clip(np.rint(w / np.float32(scale)) + zp, 0, (1 << bw) - 1).astype(
            np.uint16 if bw == 16 else np.uint8
        )
        got = table_ints(init, tmp_path, enc)
        q, _ = table_rows(w, enc)
        assert got.dtype == q.dtype == want.dtype and np.array_equal(got, want) and np.array_equal(q, want)


def test_calibration_progress_counts_the_blocks_each_unit_sees() -> None:
    """8 samples of 512 tokens at AR-N 128 are 32 blocks, and each unit (embedding, layers, head) sees all 32:
    the words said "sample 37 of 8"-like counts ("unit 37 of 136" for a part of 34 units)."""
    from types import SimpleNamespace

    from hexstudio.workers.quantize import _CalibrationProgress

    said: list[str] = []
    em = SimpleNamespace(progress=lambda frac, msg, **kw: said.append(msg))
    progress = _CalibrationProgress(["part1"], 8, em, blocks=32)  # type: ignore[arg-type]
    n = 34 * 32  # 34 units x 32 blocks
    progress("part1", 0, n)
    progress("part1", 32 * 5 + 3, n)
    assert said[0] == f"part1: calibration step 1/{n} (block 1 of 32 through unit 1 of 34)", said
    assert said[1] == f"part1: calibration step {32 * 5 + 4}/{n} (block 4 of 32 through unit 6 of 34)", said
    # a sample of AR-N tokens is one block: the words stay "sample"
    said.clear()
    _CalibrationProgress(["part1"], 8, em, blocks=8)("part1", 0, 34 * 8)  # type: ignore[arg-type]
    assert said == [f"part1: calibration step 1/{34 * 8} (sample 1 of 8 through unit 1 of 34)"], said


def test_calibration_starts_with_the_bos_genie_pushes(tmp_path: Path) -> None:
    """Calibration starts each sample with config.json's bos_token_id; Genie pushes BOS only where the tokenizer
    adds one (genie_config.json's bos-token -1 otherwise). Qwen2's config.json names <|endoftext|> while its
    tokenizer adds none: every sample was calibrated after a token the board never sends."""
    from hexstudio.workers.quant.calib import calibration_bos

    qwen = tmp_path / "qwen"
    qwen.mkdir()
    (qwen / "tokenizer_config.json").write_text(json.dumps({"bos_token": None, "eos_token": "<|im_end|>"}))
    assert calibration_bos(qwen, 151643) is None
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>"}))
    assert calibration_bos(llama, 128000) == 128000
    assert (
        calibration_bos(tmp_path, 1) == 1
    )  # no tokenizer_config.json: config.json's id, as the bundle keeps it
    assert calibration_bos(llama, None) is None


def test_the_kv_cache_is_calibrated_on_the_symmetric_grid_it_is_exported_with(
    float_parts: dict[str, Path], tmp_path: Path
) -> None:
    """Only the KV quantizers' bit width was set: they were calibrated asymmetric (the activations' default), and
    the export then swapped in a symmetric encoding, so the layers after them were calibrated on a grid the board
    never uses. qai-hub-models' LLM recipe makes them 8-bit symmetric before calibration, and so does build_sim."""
    from hexstudio.workers.quant.partwise import build_sim

    path = float_parts["prompt_ar64_cl256_2_of_2"]
    sim, counts = build_sim(path, RunSettings(weight_bits=4), Path(tempfile.mkdtemp(dir=tmp_path)), 2)
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    kv = [t.name for t in [*graph.input, *graph.output] if t.name.startswith("past_")]
    assert len(kv) == counts["kv_tensors"] == 8
    for name in kv:
        q = sim._get_enabled_quantizer(name)
        assert q is not None and q.bitwidth == 8 and q.use_symmetric_encodings, name
    sim.compute_encodings(iter([_feed(_inputs(path), np.random.default_rng(3))]))
    for name in kv:  # a signed grid centred on zero
        enc = sim._get_enabled_quantizer(name).get_encodings()[0]
        assert enc.offset == -128 and enc.bw == 8, (name, enc)


def test_int8_weights_are_per_channel_not_an_lpbq_htp_cannot_hold(
    float_parts: dict[str, Path], tmp_path: Path
) -> None:
    """weight_bits=8 went through LPBQ with 4-bit block scales: a 12-bit decompressed weight, no HTP weight type
    (and a crash on aimet-onnx 2.26). It is plain int8 per channel now, as the lm_head is."""
    from hexstudio.workers.quant.partwise import build_sim

    path = float_parts["prompt_ar64_cl256_2_of_2"]
    sim, _ = build_sim(path, RunSettings(weight_bits=8), Path(tempfile.mkdtemp(dir=tmp_path)), 2)
    proj = {n: q for n, q in sim.qc_quantize_op_dict.items() if n in sim.param_names and "_proj." in n}
    assert len(proj) == 14  # 7 projections in each of the part's 2 layers
    for n, q in proj.items():
        assert q.enabled and q.bitwidth == 8 and q.quant_info.usePerChannelMode, n
        assert q.quant_info.blockSize == 0, (n, q.quant_info.blockSize)  # per channel, not in blocks of 64
