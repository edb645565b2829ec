"""The speed predictor (issue 28): its arithmetic, the profile parser, the target resolution, and a real run of
QNN's x86 HTP simulator on tiny shapes (skipped where onnxruntime-qnn is not installed)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.services import ServiceError
from hexstudio.core.services.predict import PredictPlan, PredictRequest, plan, resolve_target, run_prediction
from hexstudio.shared.predict import (
    LABEL,
    Bandwidth,
    GraphTiming,
    ModelShape,
    Target,
    combine,
    per_layer,
    summary_lines,
    target_for_device,
)

HAVE_QNN = importlib.util.find_spec("onnxruntime_qnn") is not None
needs_qnn = pytest.mark.skipif(
    not HAVE_QNN,
    reason="onnxruntime-qnn (Qualcomm's x86 QNN HTP simulator) is not "
    "installed: `.venv/bin/pip install onnxruntime-qnn==2.7.0`",
)

TINY = ModelShape(
    name="tiny", layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512, vocab=2048
)
EVK = target_for_device(
    "Dragonwing IQ-9075 EVK", {"soc_model": 77, "dsp_arch": "v73", "chipset": "qualcomm-qcs9075"}
)


def timing(
    key: str, seq: int, layers: int, us: float, vocab: int = 0, spread: float = 0.1, context: int = 4096
) -> GraphTiming:
    return GraphTiming(
        key=key,
        seq=seq,
        context=context,
        layers=layers,
        vocab=vocab,
        sim_us=us,
        sim_lower_us=us * (1 - spread),
        sim_upper_us=us * (1 + spread),
    )


def test_per_layer_is_the_slope_and_the_intercept_is_the_fixed_cost() -> None:
    layer, fixed = per_layer(timing("a", 1, 1, 1500), timing("b", 1, 2, 2500))
    assert layer.value == pytest.approx(1.0) and fixed.value == pytest.approx(0.5)
    # a 2-layer graph costing more than twice the 1-layer one: the line through both, whose intercept is
    # negative, so that n layers in one graph cost t1 + (n - 1) x slope
    layer, fixed = per_layer(timing("a", 1, 1, 1000), timing("b", 1, 2, 2400))
    assert layer.value == pytest.approx(1.4) and fixed.value == pytest.approx(-0.4)
    assert (fixed + layer.scaled(5)).value == pytest.approx(1.0 + 4 * 1.4)
    layer, fixed = per_layer(timing("a", 1, 1, 1000), None)
    assert layer.value == pytest.approx(1.0) and fixed.value == 0.0


def big_model() -> ModelShape:  # Llama-3.2-1B's shapes
    return ModelShape(
        name="1b", layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64, intermediate=8192, vocab=128256
    )


def test_combine_adds_layers_lm_head_switches_and_ttft_counts_passes() -> None:
    m = big_model()
    t = {
        "tg1": timing("tg1", 1, 1, 2000),
        "tg2": timing("tg2", 1, 2, 3900),
        "lm_tg": timing("lm", 1, 1, 700, vocab=16384),
        "pp1": timing("pp1", 128, 1, 5000),
        "pp2": timing("pp2", 128, 2, 9800),
        "lm_pp": timing("lmp", 128, 1, 3000, vocab=16384),
    }
    p = combine("m", m, EVK, 4096, 128, 3, "2.51.0", t)
    tg = p.token
    assert tg.layers.value == pytest.approx(16 * 1.9)
    assert tg.fixed.value == pytest.approx(3 * 0.1)
    assert tg.lm_head.value == pytest.approx(0.7 * 128256 / 16384)
    assert tg.switch.value == pytest.approx(3 * 0.25)
    assert tg.total.lower <= tg.total.value <= tg.total.upper
    # the weights: 16 int4 LPBQ layers + an int8 lm_head, read once per token at 76.8 GB/s
    assert tg.weight_bytes == 16 * m.layer_weight_bytes() + 2048 * 128256
    assert tg.ddr_floor.value == pytest.approx((tg.weight_bytes + tg.kv_bytes + 2 * 2048) / 76.8e9 * 1e3)
    assert p.ttft_ms[128].value == pytest.approx(p.prompt_pass.total.value)
    assert p.ttft_ms[1024].value == pytest.approx(8 * p.prompt_pass.total.value)
    assert p.ttft_ms[4096].value == pytest.approx(32 * p.prompt_pass.total.value)
    rate = p.decode_tok_s["full_context"]
    assert rate.value == pytest.approx(1000 / tg.total.value) and rate.lower < rate.value < rate.upper
    doc = p.to_json()
    assert doc["label"] == LABEL and doc["predicted"] is True
    assert all("predicted" in line for line in summary_lines(doc) if "TTFT" in line or "tok/s" in line)


def test_the_ddr_floor_dominates_when_the_simulator_is_faster_than_dram() -> None:
    m = big_model()
    fast = {
        k: timing(k, s, n, 1.0, vocab=v)
        for k, s, n, v in (
            ("tg1", 1, 1, 0),
            ("lm_tg", 1, 1, 16384),
            ("pp1", 128, 1, 0),
            ("lm_pp", 128, 1, 16384),
        )
    }
    p = combine("m", m, EVK, 4096, 128, 1, "2.51.0", fast)
    assert p.token.dominant == "DDR weight traffic"
    assert p.token.total.value == pytest.approx(p.token.ddr_floor.value + p.token.switch.value)
    none = Target(name="x", soc_model=1, dsp_arch="v75")
    p = combine("m", m, none, 4096, 128, 1, "2.51.0", fast)
    assert p.token.ddr_floor.value == 0 and any("No DRAM bandwidth" in n for n in p.notes)
    # a device assumed in another's place is said first, where the figures are read (CLI, panel, report)
    assumed = dataclasses.replace(
        EVK, note="board 'b' does not record its device: assumed Dragonwing IQ-9075 EVK"
    )
    p = combine("m", m, assumed, 4096, 128, 1, "2.51.0", fast)
    assert p.notes[0] == f"Target: {assumed.note}."
    assert f"  note: Target: {assumed.note}." in summary_lines(p.to_json())


def test_targets_from_devices_and_boards() -> None:
    t = resolve_target(None, "Snapdragon 8 Gen 3 QRD")
    assert (t.soc_model, t.htp_arch) == (57, "75")
    assert resolve_target("sim", None).soc_model == 77
    boards: dict[str, dict[str, Any]] = {
        "evk": {"host": "x", "device": "Dragonwing IQ-9075 EVK"},
        "raw": {"soc_model": 43, "dsp_arch": "v73"},
        "bare": {"host": "y"},
    }
    assert resolve_target("evk", None, boards).bandwidth == EVK.bandwidth
    assert resolve_target("raw", None, boards).soc_model == 43
    bare = resolve_target("bare", None, boards)
    assert bare.soc_model == 77 and "assumed" in bare.note
    with pytest.raises(ServiceError):
        resolve_target("nope", None, boards)
    with pytest.raises(ServiceError):
        resolve_target(None, "Nokia 3310", boards)
    with pytest.raises(ServiceError) as err:  # not a "HexStudio bug" traceback
        resolve_target("typo", None, {"typo": {"soc_model": "QCS9075", "dsp_arch": "v73"}})
    assert "soc_model 'QCS9075': a number is expected" in err.value.message
    assert Target.from_json(EVK.to_json()) == EVK
    assert isinstance(EVK.bandwidth, Bandwidth) and EVK.bandwidth.peak_bytes_per_s == pytest.approx(76.8e9)


def test_plan_reads_shapes_from_config_json_alone() -> None:
    cfg = json.loads(
        (
            Path(__file__).parents[2] / "bench" / "configs" / "Llama-3.2-3B-Instruct" / "config.json"
        ).read_text()
    )
    p = plan(
        PredictRequest(
            model="meta-llama/Llama-3.2-3B-Instruct", device="Dragonwing IQ-9075 EVK", context_length=4096
        ),
        config=cfg,
        boards={},
    )
    assert (p.shape.layers, p.shape.hidden, p.shape.heads, p.shape.kv_heads, p.shape.head_dim) == (
        28,
        3072,
        24,
        8,
        128,
    )
    assert p.context_length == 4096 and p.ar_n == 128 and p.parts >= 1
    with pytest.raises(ServiceError) as err:  # a split the Model stage refuses is not predicted
        plan(PredictRequest(model="meta-llama/Llama-3.2-3B-Instruct", parts=40), config=cfg, boards={})
    assert "40 parts for a model of 28 layers" in err.value.message and "between 1 and 28" in (
        err.value.hint or ""
    )


PROFILE = """Msg Timestamp,Message,Time,Unit of Measurement,Timing Source,Event Level,Event Identifier
0,BACKEND,97811,CYCLES,BACKEND,SUB-EVENT,Simulated (Accelerator exec cycles)
0,BACKEND,65,US,BACKEND,SUB-EVENT,Simulated (Accelerator exec time us)
0,BACKEND,57,US,BACKEND,SUB-EVENT,Simulated (Accelerator exec time us (lower estimate))
0,BACKEND,74,US,BACKEND,SUB-EVENT,Simulated (Accelerator exec time us (upper estimate))
0,BACKEND,430080,BYTES,BACKEND,SUB-EVENT,Input Fill
0,BACKEND,2,US,BACKEND,SUB-EVENT,Missing Ops (Number of Ops with no Costs associated)
0,BACKEND,10571593,CYCLES,BACKEND,ROOT,Accelerator (execute) time (cycles)
"""


@needs_qnn
def test_parse_profile_reads_the_simulator_rows(tmp_path: Path) -> None:
    from hexstudio.workers.predict import parse_profile
    from hexstudio.workers.runtime import WorkerError

    (tmp_path / "p.csv").write_text(PROFILE)
    r = parse_profile(tmp_path / "p.csv")
    assert (r["sim_us"], r["sim_lower_us"], r["sim_upper_us"], r["sim_cycles"]) == (65, 57, 74, 97811)
    assert r["input_fill_bytes"] == 430080 and r["missing_ops"] == 2
    (tmp_path / "q.csv").write_text(
        PROFILE.splitlines()[0] + "\n0,BACKEND,1,US,BACKEND,ROOT,QNN (execute) time\n"
    )
    with pytest.raises(WorkerError):
        parse_profile(tmp_path / "q.csv")


def tiny_plan(context: int) -> PredictPlan:
    return PredictPlan(
        model="tiny", shape=TINY, target=EVK, context_length=context, ar_n=32, parts=2, two_layers=True
    )


@needs_qnn
def test_tiny_model_on_the_htp_simulator_end_to_end_and_cached(tmp_path: Path) -> None:
    """Real QNN: compiles six graphs for v73 with CPU fallback disabled, runs them, and caches the timings."""
    events: list[dict[str, object]] = []
    doc = asyncio.run(run_prediction(tiny_plan(256), tmp_path, events.append))
    assert doc["label"] == LABEL and doc["predicted"] is True and doc["qnn_version"]
    graphs = {g["key"]: g for g in doc["graphs"]}
    assert len(graphs) == 7 and all(
        g["sim_us"] > 0 and g["sim_lower_us"] <= g["sim_us"] <= g["sim_upper_us"] for g in graphs.values()
    )
    assert all(not g["cached"] for g in graphs.values())
    assert all(g["context_bytes"] > 0 for g in graphs.values())  # the QNN context binary each compile wrote
    # the weights are filled from DDR: at least the int4 weights of one layer show up as Input Fill
    # the token generator in both attention layouts; the prediction keeps the faster, and says so
    tgs = [g for g in graphs.values() if g["seq"] == 1 and g["layers"] == 1 and not g["vocab"]]
    assert len(tgs) == 2 and {g["key"].endswith("-split") for g in tgs} == {True, False}
    assert any(n.startswith("Token generator attention") for n in doc["notes"])
    tg1 = min(tgs, key=lambda g: g["sim_us"])
    assert tg1["input_fill_bytes"] >= TINY.layer_weight_bytes() * 0.9
    # a 2-layer graph costs more than a 1-layer one, an AR-32 pass more than an AR-1 token
    pp1 = next(g for g in graphs.values() if g["seq"] == 32 and g["layers"] == 1 and not g["vocab"])
    tg2 = next(g for g in graphs.values() if g["seq"] == 1 and g["layers"] == 2)
    assert tg2["sim_us"] > tg1["sim_us"] and pp1["sim_us"] > tg1["sim_us"]
    assert doc["ttft_ms"]["256"]["value"] == pytest.approx(8 * doc["ttft_ms"]["32"]["value"], abs=0.01)
    assert any(e.get("type") == "progress" for e in events)
    cached = list((tmp_path / "cache" / "predict").glob("qnn-*/soc77-v73/graphs-v*/*.json"))
    assert len(cached) == 7  # AR-1 in both attention layouts
    # nothing else is left in the cache: no job folder, no graph's temporary folder
    left = {p.relative_to(tmp_path) for p in (tmp_path / "cache" / "predict").rglob("*") if p.is_file()}
    assert left == {p.relative_to(tmp_path) for p in cached}, sorted(left)
    again = asyncio.run(run_prediction(tiny_plan(256), tmp_path))
    assert all(g["cached"] for g in again["graphs"])
    assert again["decode_tok_s"] == doc["decode_tok_s"]


@needs_qnn
def test_a_longer_context_costs_more_per_token(tmp_path: Path) -> None:
    short = asyncio.run(run_prediction(tiny_plan(128), tmp_path))
    long = asyncio.run(run_prediction(tiny_plan(1024), tmp_path))
    tg = [
        min(g["sim_us"] for g in d["graphs"] if g["seq"] == 1 and g["layers"] == 1 and not g["vocab"])
        for d in (short, long)
    ]
    assert tg[1] > tg[0]


@needs_qnn
def test_cli_predict_json_for_the_builtin_model() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hexstudio", "predict", "--board", "sim", "--one-layer", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert doc["label"] == LABEL and doc["target"]["soc_model"] == 77
    assert set(doc["ttft_ms"]) == {"128", "512"} and doc["decode_tok_s"]["full_context"]["value"] > 0
    text = subprocess.run(
        [sys.executable, "-m", "hexstudio", "predict", "--board", "sim", "--one-layer"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert text.returncode == 0 and "predicted (HTP simulator)" in text.stdout
    assert "predicted TTFT" in text.stdout and "predicted decode" in text.stdout


def test_a_model_whose_layers_lpbq_cannot_block_is_refused_up_front() -> None:
    """hidden 96 passed the plan, then every graph's child failed minutes later with "Out of memory? ... retry"."""
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 96,
        "num_attention_heads": 3,
        "num_key_value_heads": 1,
        "intermediate_size": 200,
        "num_hidden_layers": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
    }
    with pytest.raises(ServiceError) as err:
        plan(PredictRequest(model="odd/llama", device="Dragonwing IQ-9075 EVK"), config=cfg, boards={})
    assert (
        "hidden_size 96, num_attention_heads x head_dim 96, intermediate_size 200 are not multiples of 64"
        in (err.value.message)
    )
    assert err.value.hint and "multiples of 64" in err.value.hint


@needs_qnn
def test_a_graph_process_that_fails_says_its_own_error_and_only_a_killed_one_says_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hexstudio.workers import predict as worker
    from hexstudio.workers.qnn.libs import find_qnn_libs
    from hexstudio.workers.runtime import WorkerError

    libs = find_qnn_libs()
    assert libs is not None
    shape = {"hidden": 96, "heads": 3, "kv_heads": 1, "head_dim": 32, "intermediate": 200, "seq": 1}
    shape.update(context=128, layers=1, vocab=0)
    with pytest.raises(WorkerError) as err:  # the real child: its graph cannot be built
        worker.measure(shape, EVK, tmp_path, libs)
    assert "LPBQ needs input features divisible by 64" in err.value.message
    assert err.value.hint and "own error" in err.value.hint and "memory" not in err.value.hint
    # a child the kernel kills (SIGKILL, as its OOM killer does)
    kill = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    monkeypatch.setattr(worker, "graph_command", lambda *_a: (kill, None))
    with pytest.raises(WorkerError) as err:
        worker.measure({**shape, "hidden": 128}, EVK, tmp_path, libs)
    assert "exit -9" in err.value.message and err.value.hint and "out of memory" in err.value.hint


def test_a_graph_process_that_stalls_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph child ran without a time limit: a compile or simulation that stalled (swapping at 8B shapes) held
    the Predict worker until someone cancelled it."""
    from hexstudio.workers import predict as worker
    from hexstudio.workers.qnn.libs import QnnLibs
    from hexstudio.workers.runtime import WorkerError

    monkeypatch.setattr(worker, "GRAPH_TIMEOUT_S", 1)
    monkeypatch.setattr(
        worker, "graph_command", lambda *_a: ([sys.executable, "-c", "import time; time.sleep(30)"], None)
    )
    shape = {"hidden": 128, "heads": 2, "kv_heads": 1, "head_dim": 64, "intermediate": 256, "seq": 1}
    shape.update(context=128, layers=1, vocab=0)
    with pytest.raises(WorkerError) as err:
        worker.measure(shape, EVK, tmp_path, QnnLibs(tmp_path, "2.51.0", "2.7.0"))
    assert err.value.code == "predict_graph_timeout" and "was stopped" in err.value.message
    assert err.value.hint and "swapping" in err.value.hint


def test_graphs_run_under_the_side_environments_python_where_the_wheel_lives_there(tmp_path: Path) -> None:
    """The predictor read the QNN version and ran its graphs in this environment only: on the GPU recipe (the wheel
    in the installer's side venv) it stopped with "qnn_missing" and a pip hint that would break that install."""
    from hexstudio.workers.predict import graph_command
    from hexstudio.workers.qnn.libs import QnnLibs

    side = QnnLibs(tmp_path, "2.51.0", "2.7.0", python="/opt/venv-qnn/bin/python")
    argv, env = graph_command(side, "--graph", "g.json")
    assert argv == ["/opt/venv-qnn/bin/python", "-m", "hexstudio.workers.predict", "--graph", "g.json"]
    assert env is not None and env["PYTHONPATH"].split(":")[0] == str(Path(__file__).parents[2])
    here = QnnLibs(tmp_path, "2.51.0", "2.7.0")
    argv, env = graph_command(here, "--graph", "g.json")
    assert argv[1:3] == ["-m", "hexstudio.workers.predict"] and env is None


def test_a_cancelled_prediction_stops_its_simulation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The panel gives up after its time limit (or the window closes), cancelling the call: the predictor worker was
    left simulating, and the button, enabled again, started a second heavy simulation beside it."""
    from hexstudio.core import jobs

    started: list[jobs.LocalJob] = []
    real = jobs.JobRunner.start_local

    async def start_local(self: jobs.JobRunner, module: str, spec: Path, **kw: Any) -> jobs.LocalJob:
        from hexstudio.shared.worker_spec import WorkerSpec

        # a worker that works for a minute, in the predictor's place
        WorkerSpec.build("predict", spec.parent, spec.parent / "out", {"mode": "slow", "seconds": 60}).write(
            spec
        )
        job = await real(self, "tests.core.fake_worker", spec, **kw)
        started.append(job)
        return job

    monkeypatch.setattr(jobs.JobRunner, "start_local", start_local)

    async def main() -> None:
        task = asyncio.ensure_future(run_prediction(tiny_plan(256), tmp_path))
        for _ in range(200):
            await asyncio.sleep(0.05)
            if started:
                break
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    (job,) = started
    assert job.proc is not None and job.proc.returncode is not None  # stopped, not left running
