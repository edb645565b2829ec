"""Quantize + validate stages on the built-in model with real aimet-onnx (shared session run)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.cli import RUN_BUILTIN
from tests.support.runs import FAST_QUANTIZE_SETTINGS, run_stages

REPO = Path(__file__).resolve().parents[2]
METRICS = (
    "top1_agreement",
    "kl_divergence",
    "greedy_agreement",
    "perplexity_float",
    "perplexity_quantized",
    "perplexity_ratio",
    "salad_score",
)
JUDGED = ("top1_agreement", "kl_divergence", "greedy_agreement", "perplexity_ratio", "salad_score")


def _run_json(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "run.json").read_text()))


def _quantize_json(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "artifacts" / "quantize" / "quantize.json").read_text()))


def test_quantize_json_follows_the_contract(validated_run: Path) -> None:
    q = _quantize_json(validated_run)
    base = validated_run / "artifacts" / "quantize"
    assert (q["context_length"], q["ar_n"], q["parts"]) == (512, 128, 2)
    assert q["precision"]["weights"] == "int4 LPBQ block 64"
    assert q["precision"]["kv_cache"] == "int8" and q["precision"]["activations"] == "int16"
    # the table takes its Gather output's 16-bit encoding (docs/quantize.md): it said "int8 per-channel"
    assert q["precision"]["embeddings"] == "int16 per-tensor"
    names = {g["name"] for g in q["graphs"]}
    assert names == {
        "prompt_ar128_cl512_1_of_2",
        "prompt_ar128_cl512_2_of_2",
        "token_ar1_cl512_1_of_2",
        "token_ar1_cl512_2_of_2",
    }
    for g in q["graphs"]:
        for key in ("onnx", "encodings", "sim_onnx", "float_onnx"):
            assert (base / g[key]).is_file(), (g["name"], key)
        boundary = "_model_model_layers_1_Add_1_output_0"  # layers 0-1 | 2-3: one name on both sides
        assert g["inputs"][:4] == [
            "input_ids" if g["part"] == 1 else boundary,
            "attention_mask",
            "position_ids_cos",
            "position_ids_sin",
        ]
        assert g["outputs"][0] == ("logits" if g["part"] == 2 else boundary)
    assert q["positional_encoding"] == {"type": "rope", "rope-dim": 32, "rope-theta": 500000}
    assert q["encodings_version"] == "1.0.0"


def test_every_shared_io_tensor_has_one_encoding(validated_run: Path) -> None:
    """Genie's identical-quantization rule and what the board assumes of I/O encodings: one encodings file
    for a part's two graphs; past_*_in == past_*_out, 8-bit symmetric; the mask's q_max is 0.0; cos and
    sin one encoding; mask, rope and the boundary the same in every part."""
    q = _quantize_json(validated_run)
    base = validated_run / "artifacts" / "quantize"
    acts = {
        g["name"]: {
            a["name"]: a for a in json.loads((base / g["encodings"]).read_text())["activation_encodings"]
        }
        for g in q["graphs"]
    }
    docs = {g["name"]: json.loads((base / g["encodings"]).read_text()) for g in q["graphs"]}
    assert all(d["version"] == "1.0.0" for d in docs.values())
    for part in (1, 2):
        assert docs[f"prompt_ar128_cl512_{part}_of_2"] == docs[f"token_ar1_cl512_{part}_of_2"]
    for name, a in acts.items():
        g = next(x for x in q["graphs"] if x["name"] == name)
        for t in g["inputs"] + g["outputs"]:
            assert t == "input_ids" or t in a, (name, t)  # every I/O tensor quantized
        for t in g["outputs"]:
            if t.startswith("past_"):
                tin = t[:-4] + "_in"
                assert a[tin]["scale"] == a[t]["scale"] and a[tin]["offset"] == a[t]["offset"] == [-128]
                assert a[t]["bw"] == 8 and a[t]["is_sym"]
        m = a["attention_mask"]
        assert m["offset"][0] + (1 << m["bw"]) - 1 == 0  # all-ones reads as 0.0 (attend)
        assert a["position_ids_cos"]["scale"] == a["position_ids_sin"]["scale"]
        assert a["position_ids_cos"]["offset"] == a["position_ids_sin"]["offset"]
    p1, p2 = acts["prompt_ar128_cl512_1_of_2"], acts["prompt_ar128_cl512_2_of_2"]
    for t in ("attention_mask", "position_ids_cos", "_model_model_layers_1_Add_1_output_0"):
        assert p1[t]["scale"] == p2[t]["scale"] and p1[t]["offset"] == p2[t]["offset"], t


def test_encodings_hold_int4_lpbq_weights_shared_by_both_graphs(validated_run: Path) -> None:
    q = _quantize_json(validated_run)
    base = validated_run / "artifacts" / "quantize"
    encs = {g["name"]: json.loads((base / g["encodings"]).read_text()) for g in q["graphs"]}
    for name, e in encs.items():
        lpbq = [p for p in e["param_encodings"] if p.get("enc_type") == "LPBQ"]
        assert len(lpbq) >= 14, name  # q,k,v,o,gate,up,down x 2 layers
        assert all(p["compressed_bw"] == 4 and p["block_size"] == 64 for p in lpbq)
        kv = [
            a
            for a in e["activation_encodings"]
            if a["name"].startswith("past_") and a["name"].endswith(("_in", "_out"))
        ]
        assert kv and all(a["bw"] == 8 for a in kv), name  # int8 KV cache
    # one set of weights on the device: identical weight encodings in both graphs of each part
    for part in (1, 2):
        pp = {p["name"]: p for p in encs[f"prompt_ar128_cl512_{part}_of_2"]["param_encodings"]}
        tg = {p["name"]: p for p in encs[f"token_ar1_cl512_{part}_of_2"]["param_encodings"]}
        assert set(pp) == set(tg) and all(pp[n] == tg[n] for n in pp)
    head = [p for p in encs["prompt_ar128_cl512_2_of_2"]["param_encodings"] if "lm_head" in p["name"]]
    assert head and head[0]["bw"] == 8 and head[0].get("enc_type") != "LPBQ"
    m = _run_json(validated_run)["stages"]["quantize"]["metrics"]
    assert m["int4_lpbq_weight_encodings"]["value"] == 28


def test_verdict_and_every_metric_with_threshold_in_run_json(validated_run: Path) -> None:
    st = _run_json(validated_run)["stages"]["validate"]
    metrics = {k: v["value"] for k, v in st["metrics"].items()}
    assert metrics["verdict"] == "pass"
    for name in METRICS:
        assert isinstance(metrics[name], float), name
    for name in JUDGED:
        assert metrics[f"{name}_ok"] is True and f"{name}_threshold" in metrics
    assert metrics["calibration_graph_verdict"] == "pass"
    doc = json.loads((validated_run / "artifacts" / "validate" / "validation.json").read_text())
    assert doc["verdict"] == "pass" and doc["calibration_graph"]["top1_agreement"] > 0.9
    assert 0.9 < metrics["perplexity_ratio"] < 1.1 and metrics["kl_divergence"] < 0.02


def test_sim_onnx_is_plain_onnxruntime_qdq(validated_run: Path) -> None:
    import onnx

    q = _quantize_json(validated_run)
    g = next(g for g in q["graphs"] if g["name"] == "token_ar1_cl512_1_of_2")
    model = onnx.load(str(validated_run / "artifacts" / "quantize" / g["sim_onnx"]))
    ops = {n.op_type for n in model.graph.node}
    assert "DequantizeLinear" in ops and "QcQuantizeOp" not in ops
    # weights stored as integers with their scales: int4 backbone with LPBQ block scales, int8 lm_head,
    # the embedding table in its 16-bit encoding, dequantized after the Gather
    import onnx as _onnx

    types = {i.name: i.data_type for i in model.graph.initializer}
    assert types["model.embed_tokens.weight"] == _onnx.TensorProto.UINT16
    assert types["model.layers.0.self_attn.q_proj.weight"] == _onnx.TensorProto.INT4
    assert not any(t == _onnx.TensorProto.FLOAT for n, t in types.items() if n.endswith("proj.weight"))


def _scramble_token_generator(run_dir: Path) -> None:
    """Shuffle the quantized weights of the token generator's first part (prompt processor intact)."""
    import onnx
    from onnx import numpy_helper

    q = _quantize_json(run_dir)
    g = next(g for g in q["graphs"] if g["name"] == "token_ar1_cl512_1_of_2")
    path = run_dir / "artifacts" / "quantize" / g["sim_onnx"]
    model = onnx.load(str(path))
    rng = np.random.default_rng(0)
    changed = 0
    for init in model.graph.initializer:
        arr = numpy_helper.to_array(init)
        if arr.ndim == 2 and arr.size >= 4096:
            flat = arr.reshape(-1).copy()
            rng.shuffle(flat)
            init.CopyFrom(numpy_helper.from_array(flat.reshape(arr.shape), init.name))
            changed += 1
    assert changed >= 7
    onnx.save(model, str(path))


def _validate_damaged(validated_run: Path, tmp_path: Path, damage: Any) -> tuple[Any, dict[str, Any]]:
    """A copy of the validated run, its quantized graphs damaged by `damage(run_dir)`, validated again: the gate
    must stop it. Returns the run's manifest and its validation.json."""
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace

    ws_root = tmp_path / "ws"
    dest = ws_root / "runs" / validated_run.name
    shutil.copytree(validated_run, dest)
    damage(dest)
    m = Workspace(ws_root).open_run(validated_run.name)
    res = asyncio.run(Pipeline(m).run(only="validate", force=True))
    assert not res.ok and "gate not passed" in res.message
    return m, json.loads((dest / "artifacts" / "validate" / "validation.json").read_text())


@pytest.mark.slow
def test_scrambled_deployment_graph_is_caught_by_the_gate(validated_run: Path, tmp_path: Path) -> None:
    """The known trap: the calibration-shape graph is fine, the deployment pair is broken."""
    m, doc = _validate_damaged(validated_run, tmp_path, _scramble_token_generator)
    assert doc["verdict"] == "fail"
    assert doc["calibration_graph"]["verdict"] == "pass"
    assert doc["summary"] == "calibration graph fine, deployment pair broken"
    assert m.stage("validate").metric_value("verdict") == "fail"


def _prompt_processor_without_past(run_dir: Path) -> None:
    """Every quantized prompt-processor graph reads zeros where its past KV comes in: right for a first prompt
    (the past is masked out), wrong for every later block and chat turn."""
    import onnx
    from onnx import numpy_helper

    q = _quantize_json(run_dir)
    for g in q["graphs"]:
        if not g["name"].startswith("prompt_"):
            continue
        path = run_dir / "artifacts" / "quantize" / g["sim_onnx"]
        model = onnx.load(str(path))
        zero = numpy_helper.from_array(np.zeros((), np.float32), "hexstudio_test_zero")
        model.graph.initializer.append(zero)
        for inp in model.graph.input:
            if not inp.name.startswith("past_"):
                continue
            # the input stays read (the graph keeps its interface), but times zero
            muted = f"{inp.name}_muted"
            for node in model.graph.node:
                node.input[:] = [muted if x == inp.name else x for x in node.input]
            model.graph.node.insert(0, onnx.helper.make_node("Mul", [inp.name, zero.name], [muted]))
        onnx.save(model, str(path))


@pytest.mark.slow
def test_a_prompt_processor_that_ignores_its_past_is_caught_by_the_gate(
    validated_run: Path, tmp_path: Path
) -> None:
    """Validation ran the prompt processor only on first prompts (48 tokens, AR-128: one block, nothing in the
    KV cache), so a prompt processor blind to its past KV passed. Every later chat turn on the board goes through
    that path: the teacher-forced windows now send a later turn through it, judged on its own."""
    _m, doc = _validate_damaged(validated_run, tmp_path, _prompt_processor_without_past)
    assert doc["deployment_pair"]["continuation_tokens"] == 16
    assert doc["failed"] and "continuation_kl_divergence" in doc["failed"], doc["failed"]
    good = json.loads((validated_run / "artifacts" / "validate" / "validation.json").read_text())
    assert good["checks"]["continuation_kl_divergence"]["ok"]


def test_context_length_not_a_multiple_of_ar_n_is_a_clear_error(tmp_path: Path) -> None:
    """Refused before a run folder exists (a run made with it could never pass, and --resume cannot change
    it); the Model stage's own check for a hand-edited run.json is tested in tests/model."""
    from hexstudio.core.settings import SettingsError

    with pytest.raises(SettingsError, match="context_length 500 is not a multiple of AR-N 128"):
        run_stages(tmp_path, ("model", "quantize"), {"context_length": 500})
    assert not list(tmp_path.rglob("run.json"))


def test_unknown_calibration_unit_is_a_clear_error(tmp_path: Path) -> None:
    """Refused before a run folder exists (the run settings are checked), naming the choices."""
    from hexstudio.core.settings import SettingsError

    with pytest.raises(SettingsError, match='calibration_unit \'block\' is not one of "layer", "part"'):
        run_stages(tmp_path, ("model", "quantize"), {"calibration_unit": "block"})
    assert not list(tmp_path.rglob("run.json"))


def test_quantize_json_names_the_calibration_units(validated_run: Path) -> None:
    q = _quantize_json(validated_run)
    assert q["calibration"]["unit"] == "layer"
    units = {g["name"]: g["stats"]["calibration_units"] for g in q["graphs"]}
    # part 1: embedding + 2 layers; part 2: 2 layers + lm_head — one QuantSim each
    assert units == {
        "prompt_ar128_cl512_1_of_2": 3,
        "prompt_ar128_cl512_2_of_2": 3,
        "token_ar1_cl512_1_of_2": 3,
        "token_ar1_cl512_2_of_2": 3,
    }
    assert all(g["stats"]["baked_weights"] >= 7 for g in q["graphs"])
    base = validated_run / "artifacts" / "quantize"
    for g in q["graphs"]:
        assert (base / g["sim_data"]).is_file() and (base / g["float_data"]).is_file()
    assert not (base / "calib.tmp").exists()


def test_weights_are_stored_once_per_part(validated_run: Path) -> None:
    """The prompt processor and token generator of a part share one float data file and one simulation
    data file; the upload graphs (parts/) hard-link the float one; quantize.json reports the storage."""
    import onnx

    from hexstudio.workers.quant.qdq import data_files

    q = _quantize_json(validated_run)
    base = validated_run / "artifacts" / "quantize"
    for part in (1, 2):
        pp, tg = (
            next(g for g in q["graphs"] if g["part"] == part and g["kind"] == k)
            for k in ("prompt_processor", "token_generator")
        )
        assert pp["float_data"] == tg["float_data"] and pp["sim_data"] == tg["sim_data"]
        for key in ("float_onnx", "sim_onnx"):
            a, b = (onnx.load(str(base / g[key]), load_external_data=False) for g in (pp, tg))
            assert data_files(a) == data_files(b) and len(data_files(a)) == 1
            ra = {t.name: list(t.external_data) for t in a.graph.initializer if t.external_data}
            rb = {t.name: list(t.external_data) for t in b.graph.initializer if t.external_data}
            assert ra == rb  # the same bytes of the same file
        assert (
            not (base / (tg["float_onnx"] + ".data")).exists()
            and not (base / (tg["sim_onnx"] + ".data")).exists()
        )
        for g in (pp, tg):
            st = (base / g["onnx"]).parent.joinpath("model.data").stat()
            assert st.st_ino == (base / g["float_data"]).stat().st_ino  # hard link, not a copy
    # the upload the stage reports is the one the Compile stage prepares: weights as their integers, about a
    # quarter of the fp32 directories qai-hub-models uploads
    from hexstudio.workers.aihub_upload import plan_bytes

    st, every = q["storage"], q["graphs"] + q.get("variants", [])
    assert st["aihub_upload_bytes"] == sum(plan_bytes(base / g["onnx"], base / g["encodings"]) for g in every)
    fp32 = sum(plan_bytes(base / g["onnx"], base / g["encodings"], compact=False) for g in every)
    assert 0 < st["aihub_upload_bytes"] < 0.5 * fp32 and st["disk_bytes"] > 0


@pytest.mark.parametrize("content", [None, "  \n"])
def test_missing_or_empty_calibration_text_is_a_clear_error(tmp_path: Path, content: str | None) -> None:
    text = tmp_path / "calib.txt"
    if content is not None:
        text.write_text(content)
    m, res = run_stages(tmp_path / "ws", ("model", "quantize"), {"calibration_text": str(text)})
    assert not res.ok and str(text) in res.message
    assert ("does not exist" if content is None else "is empty") in res.message
    assert m.stage("quantize").state != "done"


def test_a_calibration_text_too_short_is_said_before_the_float_export(tmp_path: Path) -> None:
    """The check ran after every part's float graphs were written: at 8B, tens of GB and a long wait first."""
    text = tmp_path / "calib.txt"
    text.write_text("Only a few words here.\n")
    m, res = run_stages(
        tmp_path / "ws", ("model", "quantize"), {"calibration_text": str(text), "calibration_seq_len": 64}
    )
    assert (
        not res.ok
        and "tokens; one sample needs 64" in res.message
        and "smaller calibration_seq_len" in (res.hint or "")
    )
    log = (m.run_dir / "logs" / "quantize.jsonl").read_text(encoding="utf-8", errors="replace")
    assert "calibration_text_short" in log
    events = [line for line in log.splitlines() if "exported part" in line or "exporting the float" in line]
    assert events == [], events  # nothing was exported before the refusal


@pytest.mark.slow
def test_cancel_mid_calibration_leaves_nothing_marked_done(tmp_path: Path) -> None:
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace

    m = Workspace(tmp_path).create_run("builtin:tiny-llama", "sim", dict(FAST_QUANTIZE_SETTINGS))
    assert asyncio.run(Pipeline(m).run(only="model")).ok
    seen: list[str] = []

    async def go() -> Any:
        pipe: Pipeline

        def on_event(stage: str, ev: dict[str, Any]) -> None:
            msg = str(ev.get("message", ""))
            if ev["type"] == "progress" and "calibration step" in msg and not seen:
                seen.append(msg)
                asyncio.get_running_loop().create_task(pipe.cancel())

        pipe = Pipeline(m, on_event=on_event)
        return await pipe.run(only="quantize")

    res = asyncio.run(go())
    assert seen, "calibration never started"
    # the step count is units x samples, and the words say so (not "sample 1/24" for 8 samples)
    samples = int(FAST_QUANTIZE_SETTINGS.get("calibration_samples", 8))
    assert re.search(rf"calibration step 1/\d+ \(sample 1 of {samples} through unit 1 of \d+\)", seen[0]), (
        seen
    )
    assert not res.ok
    assert m.stage("quantize").state != "done"
    arts = Path(m.run_dir) / "artifacts"
    assert not (arts / "quantize").exists() and not (arts / "quantize.partial").exists()
    assert json.loads((Path(m.run_dir) / "run.json").read_text())["stages"]["quantize"]["state"] != "done"


def test_cli_run_until_validate(validated_run: Path) -> None:
    """The acceptance command, real aimet-onnx end to end: the shared validated run is made by it
    (tests/support/runs.py, build_validated_run), which kept its exit code and JSON."""
    from tests.support.runs import CLI_RECORD

    rec = json.loads((validated_run.parents[1] / CLI_RECORD).read_text())
    assert rec["cmd"][1:6] == list(RUN_BUILTIN) and rec["cmd"][6:9] == ["--until", "validate", "--json"]
    out = rec["out"]
    assert rec["returncode"] == 0 and out["ok"], (out, rec["stderr_tail"])
    assert Path(out["run_dir"]) == validated_run
    run = _run_json(validated_run)
    assert all(run["stages"][s]["state"] == "done" for s in ("model", "preflight", "quantize", "validate"))
    assert run["stages"]["validate"]["metrics"]["verdict"]["value"] == "pass"
    assert run["stages"]["quantize"]["metrics"]["int4_lpbq_weight_encodings"]["value"] > 0


def test_decoder_weights_left_out_of_lpbq_are_said() -> None:
    """aimet-onnx keeps a weight whose input features do not divide into blocks of 64 at int8, without a word
    (strict=False): the run said nothing, and the bundle was bigger than the W4 figures promised."""
    import io
    import json as _json

    from hexstudio.shared.protocol import Emitter
    from hexstudio.workers.quantize import _say_weights_not_in_blocks

    out = io.StringIO()
    graphs = [
        {
            "name": "prompt_1_of_2",
            "kind": "prompt_processor",
            "stats": {"backbone_weights": 14, "int4_lpbq_weight_encodings": 12},
        },
        {
            "name": "prompt_2_of_2",
            "kind": "prompt_processor",
            "stats": {"backbone_weights": 14, "int4_lpbq_weight_encodings": 14},
        },
        {
            "name": "token_1_of_2",
            "kind": "token_generator",
            "stats": {"backbone_weights": 14, "int4_lpbq_weight_encodings": 12},
        },
    ]
    _say_weights_not_in_blocks(graphs, Emitter(out))
    events = [_json.loads(line) for line in out.getvalue().splitlines()]
    warnings = [e for e in events if e.get("type") == "warning"]
    assert len(warnings) == 1 and warnings[0]["code"] == "lpbq_not_applied", events
    assert "prompt_1_of_2: 2 of 14 decoder weights stayed int8" in warnings[0]["message"]
