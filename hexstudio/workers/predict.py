"""The speed predictor's worker (issue 28): compile synthetic decoder layers at a model's true shapes for the
target's Hexagon arch, run them on QNN's x86 HTP simulator under profiling, and add up the "Simulated
(Accelerator exec time us)" figures (hexstudio.shared.predict.combine) into predicted TTFT and tokens/s.

Spec inputs (hexstudio/core/services/predict.py writes them):
    model (str), shape (ModelShape fields), target (Target.to_json()), context_length, ar_n, parts,
    cache_dir (per QNN version / target / graph shape), two_layers (bool: also the 2-layer graphs, for the
    per-layer slope and the per-graph fixed cost)
Writes prediction.json (Prediction.to_json()) to out_dir.

Each graph is compiled and run in a child process of its own (`python -m hexstudio.workers.predict --graph FILE`): the
memory of one compile is given back before the next, and its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hexstudio.shared.predict import GraphTiming, ModelShape, Target, combine
from hexstudio.shared.protocol import Emitter
from hexstudio.shared.python_command import python_command
from hexstudio.workers.qnn.libs import INSTALL_HINT, QnnLibs, find_qnn_libs, with_workers_on_path
from hexstudio.workers.runtime import WorkerError, WorkerSpec, worker_main

LM_SLICE = 16384  # lm_head columns compiled; its cost is scaled linearly to the vocabulary (a matmul's N)
QNN_MISSING = ("The speed predictor needs Qualcomm's x86 QNN libraries (onnxruntime-qnn).", INSTALL_HINT)


# one graph's compile and simulation in its own process: minutes at 8B shapes; a stall is stopped
GRAPH_TIMEOUT_S = 2 * 3600


def qnn_libs() -> QnnLibs:
    """Qualcomm's x86 libraries: in this environment, or in the side environment the installer made where this one
    cannot hold the wheel (the validated GPU recipe); each graph's child runs under that environment's python."""
    libs = find_qnn_libs()
    if libs is None:
        raise WorkerError("qnn_missing", *QNN_MISSING)
    return libs


def graph_command(libs: QnnLibs, *args: str) -> tuple[list[str], dict[str, str] | None]:
    """How a graph's child process starts: as this process runs a worker, or under the side environment's python
    with this checkout's hexstudio on its path."""
    if libs.in_process:
        return python_command("hexstudio.workers.predict", *args), None
    return [libs.python, "-m", "hexstudio.workers.predict", *args], with_workers_on_path(dict(os.environ))


def parse_profile(path: Path) -> dict[str, Any]:
    """The simulator's rows of QNN's profiling CSV (facts/qnn-x86.md): simulated cycles and time (with lower and
    upper estimates), the bandwidth stats in bytes and the count of ops without a cost."""
    rows: dict[str, float] = {}
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        for row in csv.reader(f):
            if len(row) >= 7 and row[-1] not in rows:
                try:
                    rows[row[-1].strip()] = float(row[2])
                except ValueError:
                    continue
    want = "Simulated (Accelerator exec time us)"
    if want not in rows:
        raise WorkerError(
            "no_simulated_rows",
            f"QNN's profile {path.name} has no '{want}' row.",
            "The QNN libraries may not simulate this target; check the QNN version and htp_arch.",
        )
    return {
        "sim_us": rows[want],
        "sim_lower_us": rows.get("Simulated (Accelerator exec time us (lower estimate))", rows[want]),
        "sim_upper_us": rows.get("Simulated (Accelerator exec time us (upper estimate))", rows[want]),
        "sim_cycles": int(rows.get("Simulated (Accelerator exec cycles)", 0)),
        "input_fill_bytes": int(rows.get("Input Fill", 0)),
        "intermediate_fill_bytes": int(rows.get("Intermediate Fill", 0)),
        "intermediate_spill_bytes": int(rows.get("Intermediate Spill", 0)),
        "output_spill_bytes": int(rows.get("Output Spill", 0)),
        "missing_ops": int(rows.get("Missing Ops (Number of Ops with no Costs associated)", 0)),
    }


def measure_here(shape: dict[str, Any], target: Target, work: Path) -> dict[str, Any]:
    """Build, compile (QNN EP, HTP backend, CPU fallback disabled) and run one graph; its profile's figures."""
    import onnxruntime as ort

    try:
        import onnxruntime_qnn
    except ImportError:
        raise WorkerError("qnn_missing", *QNN_MISSING) from None
    from hexstudio.workers.predict_graphs import LayerShape, build, feeds, save

    s = LayerShape(**shape)
    path = work / "graph.onnx"
    save(build(s), path)
    lib = Path(onnxruntime_qnn.get_library_path())
    try:
        ort.register_execution_provider_library("QNNExecutionProvider", str(lib))
    except Exception as exc:  # registered already in this process
        if "already" not in str(exc).lower():
            raise
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    if not devices:
        raise WorkerError(
            "qnn_missing", "onnxruntime found no QNN execution provider device.", QNN_MISSING[1]
        )
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # nothing may run on the CPU EP
    so.log_severity_level = 3
    # also write the QNN context binary, as a local compile does: its size is the compile's output (issue 28 #5)
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", "0")
    so.add_session_config_entry("ep.context_file_path", str(work / "ctx" / "graph_ctx.onnx"))
    (work / "ctx").mkdir()
    profile = work / "profile.csv"
    so.add_provider_for_devices(
        devices,
        {
            "backend_path": str(lib.parent / "libQnnHtp.so"),
            "htp_arch": target.htp_arch,
            "soc_model": str(target.soc_model),
            "profiling_level": "detailed",
            "profiling_file_path": str(profile),
        },
    )
    t0 = time.monotonic()
    try:
        sess = ort.InferenceSession(str(path), so)
    except Exception as exc:
        raise WorkerError(
            "predict_compile_failed",
            f"QNN could not compile the synthetic {s.key()} graph for {target.dsp_arch}: {str(exc)[:400]}",
            "Check that the target's Hexagon arch is v69 or newer (LPBQ int4 weights).",
        ) from None
    compile_s = time.monotonic() - t0
    context_bytes = sum(f.stat().st_size for f in (work / "ctx").glob("*.bin"))
    t0 = time.monotonic()
    sess.run(None, feeds(s))
    run_s = time.monotonic() - t0
    del sess  # the profile is written when the session ends
    return {
        **parse_profile(profile),
        "compile_s": round(compile_s, 2),
        "run_s": round(run_s, 2),
        "context_bytes": context_bytes,
    }


def graph_main(argv: list[str]) -> int:
    """`python -m hexstudio.workers.predict --graph REQUEST.json --out TIMING.json`: one graph in this process."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--graph", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    req = json.loads(a.graph.read_text())
    with tempfile.TemporaryDirectory(prefix="hexstudio-predict-", dir=req.get("tmp")) as tmp:
        try:
            res = measure_here(req["shape"], Target.from_json(req["target"]), Path(tmp))
        except WorkerError as exc:
            a.out.write_text(json.dumps({"error": exc.fields()}))
            return 1
    res["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    a.out.write_text(json.dumps(res))
    return 0


def measure(
    shape: dict[str, Any], target: Target, cache_dir: Path, libs: QnnLibs, em: Emitter | None = None
) -> GraphTiming:
    """One graph's timing, from the cache (per QNN version, target and shape) or a child process."""
    from hexstudio.workers.predict_graphs import GRAPHS_VERSION, LayerShape

    s, qnn = LayerShape(**shape), libs.qnn_version
    cached = cache_dir / f"qnn-{qnn}" / target.key() / f"graphs-v{GRAPHS_VERSION}" / f"{s.key()}.json"
    if cached.is_file():
        try:
            return GraphTiming.from_json({**json.loads(cached.read_text()), "cached": True})
        except (ValueError, TypeError):
            pass
    cached.parent.mkdir(parents=True, exist_ok=True)
    # in the worker's private tmp (its job's folder), not beside the cache: a killed worker leaves no graph there
    with tempfile.TemporaryDirectory(prefix="predict-") as tmp:
        req, out = Path(tmp) / "request.json", Path(tmp) / "timing.json"
        req.write_text(json.dumps({"shape": shape, "target": target.to_json(), "tmp": tmp}))
        argv, env = graph_command(libs, "--graph", str(req), "--out", str(out))
        try:
            proc = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=env,
                timeout=GRAPH_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as exc:  # a stalled compile or simulation (swapping at 8B shapes)
            raise WorkerError(
                "predict_graph_timeout",
                f"Simulating the {s.key()} graph took more than {GRAPH_TIMEOUT_S // 3600} h and was stopped.",
                "The machine is most likely swapping: close other work (or predict a smaller context) and run the "
                "prediction again; graphs already simulated are kept in the cache.",
            ) from exc
        if not out.is_file():
            tail = (proc.stderr or "").strip().splitlines()[-3:]
            killed = (
                proc.returncode < 0 or proc.returncode == 137
            )  # a signal: the kernel's OOM killer, mostly
            raise WorkerError(
                "predict_graph_failed",
                f"Simulating the {s.key()} graph ended with exit "
                f"{proc.returncode} and no result: {' | '.join(tail)[:500]}",
                "It was killed: out of memory, most likely. A layer at 8B shapes needs a few GB; close other "
                "work and retry."
                if killed
                else "The last lines above are the graph process's own error. Send them with the studio's log if "
                "they do not say what to change.",
            )
        res = json.loads(out.read_text())
    if "error" in res:
        e = res["error"]
        raise WorkerError(e.get("code", "predict_failed"), e.get("message", "?"), e.get("hint"))
    t = GraphTiming.from_json(
        {
            **res,
            "key": s.key(),
            "seq": s.seq,
            "context": s.context,
            "layers": s.layers,
            "vocab": s.vocab,
            "qnn_version": qnn,
        }
    )
    tmp_path = cached.with_suffix(f".{os.getpid()}.tmp")  # two predictors may finish the same graph at once
    tmp_path.write_text(json.dumps(t.to_json(), indent=1))
    os.replace(tmp_path, cached)
    return t


def graph_shapes(m: ModelShape, context: int, ar_n: int, two_layers: bool) -> dict[str, dict[str, Any]]:
    """The graphs to simulate, in order: AR-1 with 1 layer in both attention layouts (the KV cache concatenated,
    or the past and new entries attended separately: whichever the simulator finds faster is the token
    generator's), then with 2 layers, the lm_head, and the same for AR-N (concatenated KV, per-head attention).
    "tg2" is given the layout of the faster "tg1" at run time (`run`)."""
    base = {
        "hidden": m.hidden,
        "heads": m.heads,
        "kv_heads": m.kv_heads,
        "head_dim": m.head_dim,
        "intermediate": m.intermediate,
        "context": context,
    }
    out: dict[str, dict[str, Any]] = {}
    for kind, seq in (("tg", 1), ("pp", ar_n)):
        out[f"{kind}1"] = {**base, "seq": seq, "layers": 1}
        if kind == "tg":
            out["tg1_split"] = {**base, "seq": seq, "layers": 1, "kv_concat": False}
        if two_layers:
            out[f"{kind}2"] = {**base, "seq": seq, "layers": 2}
        out[f"lm_{kind}"] = {**base, "seq": seq, "layers": 1, "vocab": min(m.vocab, LM_SLICE)}
    return out


def run(spec: WorkerSpec, em: Emitter) -> dict[str, Any]:
    work = spec.predict
    if work is None:
        raise WorkerError(
            "spec_invalid", 'The predict spec names no model shape (its "predict" part is missing).'
        )
    m, target = work.shape, work.target
    context, ar_n, parts = work.context_length, work.ar_n, work.parts
    cache_dir = work.cache_dir
    libs = qnn_libs()
    qnn = libs.qnn_version
    shapes = graph_shapes(m, context, ar_n, work.two_layers)
    timings: dict[str, GraphTiming] = {}
    slower: GraphTiming | None = None  # the token generator's other attention layout
    split = False
    for i, (name, shape) in enumerate(shapes.items()):
        if name == "tg2" and split:
            shape = {**shape, "kv_concat": False}
        em.progress(i / (len(shapes) + 1), f"simulating {name} ({i + 1}/{len(shapes)}) for {target.dsp_arch}")
        t = measure(shape, target, cache_dir, libs, em)
        em.log(
            f"{name}: {t.sim_us:.0f} us simulated ({t.sim_lower_us:.0f}-{t.sim_upper_us:.0f})"
            + (
                " (cached)"
                if t.cached
                else f", compiled in {t.compile_s:.1f} s, peak RSS {t.peak_rss_bytes / 2**20:.0f} MiB"
            )
        )
        if name == "tg1_split":  # the token generator takes the faster of the two layouts
            split = t.sim_us < timings["tg1"].sim_us
            if split:
                timings["tg1"], t = t, timings["tg1"]
            slower = t
            continue
        timings[name] = t
    p = combine(work.model or m.name, m, target, context, ar_n, parts, qnn, timings)
    if slower is not None:
        p.graphs.append(slower)
        p.notes.append(
            "Token generator attention: "
            + (
                "the past and the new KV entries attended separately"
                if split
                else "over the KV cache concatenated with the new entries"
            )
            + f" ({timings['tg1'].sim_us:.0f} us per layer), faster in the simulator than the other "
            f"layout ({slower.sim_us:.0f} us); the prediction assumes the faster one."
        )
    doc = p.to_json()
    spec.out_dir.mkdir(parents=True, exist_ok=True)
    (spec.out_dir / "prediction.json").write_text(json.dumps(doc, indent=2))
    em.artifact("prediction.json", kind="json", role="prediction")
    rate = p.decode_tok_s["full_context"]
    em.metric("predicted_decode_tok_s", round(rate.value, 2), unit="tok/s", scope="predicted")
    em.metric(
        f"predicted_ttft_ms_{ar_n}", round(p.ttft_ms[min(p.ttft_ms)].value, 1), unit="ms", scope="predicted"
    )
    em.progress(1.0, f"predicted {rate.value:.1f} tok/s decode")
    return {"prediction": doc, "shape": asdict(m)}


if __name__ == "__main__":
    if "--graph" in sys.argv[1:]:
        raise SystemExit(graph_main(sys.argv[1:]))
    raise SystemExit(worker_main("predict", run))
