"""Preflight's AIMET smoke test: the calls quantization really makes, on a graph of a few kilobytes.

A calibration unit in miniature (hexstudio/workers/quant/partwise.quantize_unit): a decoder-like graph with a
backbone weight (LPBQ int4, blocks of 64), an `lm_head` weight (int8 per channel) and a KV pair
`past_key_0_in` -> `past_key_0_out` (8-bit), built into a QuantSim by the stage's own build_sim,
calibrated, its encodings exported in format 1.0.0, its quantized weights computed by AIMET's kernel
(save_baked), the simulation graph built from them (build_qdq, onnx's version converter included) and
run with onnxruntime against the float graph. Each step is named, so a stack that cannot quantize
fails here with the step, the error and the fix, in seconds rather than an hour into the model.

    python -m hexstudio.workers.quant.smoke          # one JSON line: {"ok", "seconds", "step", "error", "features", ...}
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STEPS = ("import", "graph", "quantsim", "calibrate", "export", "baked_weights", "simulation_graph", "run")

FIX = (
    "Install a stack HexStudio quantizes with: the validated recipe (Python 3.10, aimet-onnx 2.26, onnx 1.18, "
    "transformers 4.45; `bash packaging/install-workstation.sh`) or the current one "
    "(hexstudio/shared/data/recipes/current.txt; `./dev setup`), then run preflight again."
)


def _graph(folder: Path) -> Path:
    """x[1,64] -> MatMul(layers.0.w) + past_key_0_in -> past_key_0_out -> MatMul(lm_head.weight) -> logits."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((64, 64)) * 0.1).astype(np.float32), "model.layers.0.w")
    head = numpy_helper.from_array((rng.standard_normal((64, 32)) * 0.1).astype(np.float32), "lm_head.weight")
    nodes = [
        helper.make_node("MatMul", ["x", "model.layers.0.w"], ["h"], name="/layers.0/MatMul"),
        helper.make_node("Add", ["h", "past_key_0_in"], ["past_key_0_out"], name="/layers.0/Add"),
        helper.make_node("MatMul", ["past_key_0_out", "lm_head.weight"], ["logits"], name="/lm_head/MatMul"),
    ]
    g = helper.make_graph(
        nodes,
        "smoke",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64]),
            helper.make_tensor_value_info("past_key_0_in", TensorProto.FLOAT, [1, 64]),
        ],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 32]),
            helper.make_tensor_value_info("past_key_0_out", TensorProto.FLOAT, [1, 64]),
        ],
        [w, head],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "unit.onnx"
    onnx.save(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="unit.onnx.data",
        size_threshold=0,
    )
    return path


def run(threads: int = 1) -> dict[str, Any]:
    t0 = time.time()
    out: dict[str, Any] = {"ok": False, "step": "import"}
    try:
        import numpy as np

        from hexstudio.shared.run_settings import RunSettings
        from hexstudio.workers.quant import aimet_compat
        from hexstudio.workers.quant.io_encodings import ENCODING_VERSION
        from hexstudio.workers.quant.partwise import (
            baked_path,
            build_sim,
            count_encodings,
            pin_encoding_version,
            save_baked,
        )
        from hexstudio.workers.quant.qdq import build_qdq

        out["features"] = aimet_compat.features()
        with tempfile.TemporaryDirectory(prefix="hexsmoke-") as d:
            folder = Path(d)
            out["step"] = "graph"
            path = _graph(folder)
            rng = np.random.default_rng(1)
            feeds = [
                {
                    "x": rng.standard_normal((1, 64)).astype(np.float32),
                    "past_key_0_in": rng.standard_normal((1, 64)).astype(np.float32),
                }
                for _ in range(4)
            ]
            out["step"] = "quantsim"
            (folder / "sim").mkdir()
            sim, counts = build_sim(
                path, RunSettings(weight_bits=4, activation_bits=16, kv_bits=8), folder / "sim", threads
            )
            out["step"] = "calibrate"
            sim.compute_encodings(iter(feeds))
            out["step"] = "export"
            pin_encoding_version()
            sim.export(str(folder), "unit", export_model=False)
            enc = folder / "unit.encodings"
            doc = json.loads(enc.read_text(encoding="utf-8"))
            if doc.get("version") != ENCODING_VERSION:
                raise ValueError(f"encodings format {doc.get('version')!r}, not {ENCODING_VERSION}")
            stats = count_encodings(enc)
            if stats["int4_lpbq_weight_encodings"] < 1:
                raise ValueError(f"no int4 LPBQ weight encoding was exported ({stats})")
            acts = {a["name"]: a for a in doc.get("activation_encodings", [])}
            kv = [acts[n]["bw"] for n in ("past_key_0_in", "past_key_0_out") if n in acts]
            if not kv or any(int(b) != 8 for b in kv):
                raise ValueError(f"the KV tensors are not 8-bit: {kv}")
            out["step"] = "baked_weights"
            if save_baked(sim, baked_path(enc)) < 2:
                raise ValueError("AIMET quantized fewer than the two weights")
            del sim
            out["step"] = "simulation_graph"
            qdq = folder / "sim.onnx"
            build_qdq(path, enc, [baked_path(enc)], qdq)
            out["step"] = "run"
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            f = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            q = ort.InferenceSession(str(qdq), so, providers=["CPUExecutionProvider"])
            a = f.run(["logits"], feeds[0])[0]
            b = q.run(["logits"], feeds[0])[0]
            err = float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) + 1e-9))
            if not np.isfinite(err) or err > 0.2:
                raise ValueError(
                    f"the simulation graph's logits differ from the float graph's by {err:.3f} "
                    "(relative): its weights or encodings are wrong"
                )
            out.update(ok=True, step=None, relative_error=round(err, 5), counts=counts, encodings=stats)
    except Exception as exc:  # each failure is reported with its step
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["fix"] = FIX
    out["seconds"] = round(time.time() - t0, 3)
    return out


def main() -> int:
    res = run()
    print(json.dumps(res), flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
