"""Quantize and validate at the true Llama-3.1-8B layer shapes (issue 20): slices of 2 and 4 decoder layers of
hidden 4096 / FFN 14336 / 32 heads, 8 KV heads / 128,256-token vocabulary (random bf16 weights), context 4096,
AR-128, 2 parts, the stage defaults otherwise (unit-wise calibration and validation). For each slice it prints
the quantize and validate peak RSS (the child's ru_maxrss), their wall times, the run folder's disk (hard
links counted once) and the AI Hub upload size; then, per figure, the per-layer slope and the intercept of the
line through the two slices and its value at 32 layers (the 8B).

    .venv/bin/python bench/llama8b_shapes.py [--layers 2,4] [--json F] [--keep] [--no-validate]

Targets (issue 20): quantize peak <= 8 GiB, validate peak <= 8 GiB, run-folder disk <= 60 GB at 32 layers;
(issue 28) AI Hub upload <= 25 GB at 32 layers: the upload directories as the Compile stage prepares them
(integer-encoded weights and the embedding table as their integers) and the zips the qai_hub client sends;
the fp32 upload of before beside it.
Takes many minutes on 2 cores and needs ~25 GB of free disk per slice; run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quantize_memory as qm

from hexstudio.shared.disk_use import tree_bytes

REPO = qm.REPO
HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 4096, 14336, 32, 8, 128256
CONTEXT, AR_N, PARTS = 4096, 128, 2
TARGET_RSS, TARGET_DISK, TARGET_UPLOAD = 8 * 2**30, 60e9, 25e9

MAKE = r"""
import json, sys, shutil, torch
from pathlib import Path
from typing import Any
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
out, layers = Path(sys.argv[1]), int(sys.argv[2])
h, ffn, nh, kvh, vocab = map(int, sys.argv[3:8])
src = Path(sys.argv[8])
out.mkdir(parents=True, exist_ok=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(src / f, out / f)
cfg = LlamaConfig(hidden_size=h, num_hidden_layers=layers, num_attention_heads=nh, num_key_value_heads=kvh,
                  intermediate_size=ffn, vocab_size=vocab, max_position_embeddings=131072, rope_theta=500000.0,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192},
                  bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, torch_dtype="bfloat16")
with torch.device("meta"):
    m = LlamaForCausalLM(cfg)
g = torch.Generator().manual_seed(0)
state, n = {}, 0
for name, p in m.state_dict().items():
    if name.endswith("norm.weight"):
        t = torch.ones(p.shape, dtype=torch.bfloat16)
    else:
        t = (torch.randn(p.shape, generator=g) * 0.02).to(torch.bfloat16)
    state[name] = t
    n += t.numel()
save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
cfg.save_pretrained(out)
print(n)
"""


def make(work: Path, layers: int) -> tuple[Path, int]:
    out = work / f"llama8b-{layers}l"
    return out, qm.synthetic_model(MAKE, out, layers, HIDDEN, FFN, HEADS, KV_HEADS, VOCAB)


def upload(run: Path, work: Path) -> dict[str, float]:
    """What the AI Hub compile uploads for every graph (hexstudio/workers/aihub_upload.py, as the Compile stage prepares
    it): the directories' bytes, and the zip the qai_hub client builds of each (deflate level 1) and sends."""
    import time

    from hexstudio.workers.aihub_upload import plan_bytes, write_upload_dir, zipped_bytes

    qdir = run / "artifacts" / "quantize"
    q = json.loads((qdir / "quantize.json").read_text())
    out = {
        "bytes": 0.0,
        "zipped": 0.0,
        "prepare_s": 0.0,
        "int_params": 0.0,
        "fp32_bytes": 0.0,  # the fp32 upload of before (setting aihub_compact_upload off), for comparison
        "fp32_params": 0.0,
    }
    for g in q["graphs"]:
        out["fp32_bytes"] += plan_bytes(qdir / g["onnx"], qdir / g["encodings"], compact=False)
        t0 = time.monotonic()
        d, st = write_upload_dir(qdir / g["onnx"], qdir / g["encodings"], work / "upload", g["name"])
        out["prepare_s"] += time.monotonic() - t0
        if st.inexact:
            print(f"   {g['name']}: {len(st.inexact)} weights stay fp32 (not exact)", flush=True)
        out["bytes"] += st.bytes
        out["int_params"] += st.int_params  # int4/int8 weights in int8, the embedding table in uint16
        out["fp32_params"] += st.fp32_params
        out["zipped"] += zipped_bytes(d, work / "zip")
        shutil.rmtree(d, ignore_errors=True)
    return out


COMPILE = r"""
import json, resource, sys, time
from pathlib import Path
from hexstudio.workers.qnn.bundle import prepare_htp_graphs
from hexstudio.workers.qnn.compile import compile_part, read_back
from hexstudio.workers.qnn.ep import HtpTarget
from hexstudio.shared.bundle import device_info
from hexstudio.shared.protocol import Emitter
qdir, work = Path(sys.argv[1]), Path(sys.argv[2])
q = json.loads((qdir / "quantize.json").read_text())
dev = device_info("Dragonwing IQ-9075 EVK")
target = HtpTarget(int(dev["soc_model"]), str(dev["dsp_arch"]))
t0 = time.monotonic()
graphs = prepare_htp_graphs(qdir, q, work, Emitter(sys.stderr))
rewrite_s = time.monotonic() - t0
rewrite_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
parts = []
for k in range(1, int(q["parts"]) + 1):
    pg = [g for g in graphs if g.part == k]
    cp = compile_part(pg, work / "ctx" / pg[0].name, target, shared=True)
    read_back(cp, pg)
    parts.append({"part": k, "graphs": [g.name for g in pg], "layers": len(next(x for x in q["graphs"] if x["name"] == pg[0].name)["layers"]),
                  "seconds": cp.seconds, "peak_rss_bytes": cp.peak_rss_bytes, "bin_bytes": sum(b.stat().st_size for b in cp.bins)})
    print(json.dumps(parts[-1]), file=sys.stderr, flush=True)
print(json.dumps({"rewrite_s": rewrite_s, "rewrite_peak_rss_bytes": rewrite_peak, "parts": parts,
                  "wall_s": time.monotonic() - t0}))
"""


def compile_run(run: Path, work: Path) -> dict[str, Any]:
    """Compile a kept slice's quantize output locally with QNN (the Compile stage's local path: the HTP graph
    rewrite in this child, then one child per part, shared form, read back through libQnnSystem)."""
    qdir = run / "artifacts" / "quantize"
    p = subprocess.run(
        [qm.PY, "-c", COMPILE, str(qdir), str(work / "htp")],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    if p.returncode != 0:
        raise RuntimeError(f"local compile failed: {p.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    doc["work_disk_bytes"] = tree_bytes(work / "htp")  # the rewritten graphs + the context binaries
    shutil.rmtree(work / "htp", ignore_errors=True)
    return doc


def line(x: list[int], y: list[float]) -> tuple[float, float, float]:
    """(slope per layer, intercept, value at 32 layers) through the first and last point."""
    slope = (y[-1] - y[0]) / max(x[-1] - x[0], 1)
    icpt = y[0] - slope * x[0]
    return slope, icpt, icpt + 32 * slope


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="2,4")
    ap.add_argument("--samples", type=int, default=2, help="calibration samples of 128 tokens")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-validate", action="store_true", help="quantize and measure the AI Hub upload only")
    ap.add_argument(
        "--compile-run",
        type=Path,
        help="only compile this kept slice's run folder locally (QNN), "
        "measured: wall, peak RSS, context binary bytes per part",
    )
    args = ap.parse_args()
    if args.compile_run:
        doc = compile_run(
            args.compile_run,
            Path(tempfile.mkdtemp(prefix="hexbench-8bc-", dir=os.environ.get("HEXBENCH_DIR"))),
        )
        for part in doc["parts"]:
            print(
                f"part {part['part']} ({part['layers']} decoder layers; {', '.join(part['graphs'])}): "
                f"{part['seconds']:.0f} s, peak {part['peak_rss_bytes'] / 2**30:.2f} GiB, "
                f"context binary {part['bin_bytes'] / 1e9:.2f} GB",
                flush=True,
            )
        print(
            f"rewrite: {doc['rewrite_s']:.0f} s, peak {doc['rewrite_peak_rss_bytes'] / 2**30:.2f} GiB; "
            f"total {doc['wall_s']:.0f} s; work folder {doc['work_disk_bytes'] / 1e9:.2f} GB"
        )
        if args.json:
            args.json.write_text(json.dumps(doc, indent=2))
        return 0
    qm.CONTEXT, qm.AR_N = CONTEXT, AR_N
    qm.SETTINGS = {**qm.SETTINGS, "calibration_samples": args.samples, "calibration_seq_len": AR_N}
    work = Path(tempfile.mkdtemp(prefix="hexbench-8b-", dir=os.environ.get("HEXBENCH_DIR")))
    gib, rows = 2**30, []
    try:
        for layers in [int(x) for x in args.layers.split(",")]:
            hf, params = make(work, layers)
            print(
                f"{layers} layers: {params / 1e9:.2f}B parameters (bf16 checkpoint {tree_bytes(hf) / 1e9:.1f} GB)",
                flush=True,
            )
            q = qm.measure(hf, layers, PARTS, work, keep_output=True, unit="layer")
            run = Path(str(q["run"]))
            qdisk = tree_bytes(run)
            up = upload(run, work)
            v: dict[str, Any] = {"peak_rss_bytes": 0, "wall_s": 0}
            vdoc: dict[str, Any] = {"verdict": "not run"}
            if not args.no_validate:
                v = qm.validate(run)
                vdoc = json.loads((run / "artifacts" / "validate.partial" / "validation.json").read_text())
            row = {
                "layers": layers,
                "params": params,
                "quantize_peak": q["peak_rss_bytes"],
                "quantize_wall": q["wall_s"],
                "validate_peak": v["peak_rss_bytes"],
                "validate_wall": v["wall_s"],
                "run_disk": tree_bytes(run),
                "quantize_disk": qdisk,
                "aihub_upload_fp32": up["fp32_bytes"],
                "aihub_upload": up["bytes"],
                "aihub_upload_zipped": up["zipped"],
                "upload_prepare_s": up["prepare_s"],
                "upload_int_params": up["int_params"],
                "upload_fp32_params": up["fp32_params"],
                "verdict": vdoc["verdict"],
                "export_check": vdoc.get("float_export", {}).get("checks"),
            }
            rows.append(row)
            print(
                f"   quantize: peak {row['quantize_peak'] / gib:.2f} GiB, {row['quantize_wall']:.0f} s; validate: peak "
                f"{row['validate_peak'] / gib:.2f} GiB, {row['validate_wall']:.0f} s ({row['verdict']}); run folder "
                f"{row['run_disk'] / 1e9:.1f} GB; AI Hub upload {row['aihub_upload'] / 1e9:.2f} GB "
                f"(zipped as the client sends it {row['aihub_upload_zipped'] / 1e9:.2f} GB; fp32 before "
                f"{row['aihub_upload_fp32'] / 1e9:.2f} GB)",
                flush=True,
            )
            if args.json:
                args.json.write_text(json.dumps({"rows": rows}, indent=2))
            shutil.rmtree(hf, ignore_errors=True)
            if not args.keep:
                shutil.rmtree(run, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    xs = [r["layers"] for r in rows]
    out: dict[str, Any] = {"rows": rows}
    if len(rows) >= 2:
        print("\nper-layer slope, intercept, extrapolated to 32 layers (Llama-3.1-8B):")
        for key, unit, scale, target in (
            ("quantize_peak", "GiB", gib, TARGET_RSS),
            ("validate_peak", "GiB", gib, TARGET_RSS),
            ("run_disk", "GB", 1e9, TARGET_DISK),
            ("aihub_upload_fp32", "GB", 1e9, None),
            ("aihub_upload", "GB", 1e9, TARGET_UPLOAD),
            ("aihub_upload_zipped", "GB", 1e9, TARGET_UPLOAD),
            ("quantize_wall", "s", 1, None),
            ("validate_wall", "s", 1, None),
        ):
            s, c, at32 = line(xs, [float(r[key]) for r in rows])
            ok = "" if target is None else ("  target met" if at32 <= target else "  target NOT met")
            print(
                f"  {key:14s} slope {s / scale:8.3f} {unit}/layer  intercept {c / scale:8.2f} {unit}  "
                f"32 layers {at32 / scale:8.2f} {unit}{ok}"
            )
            out[key + "_line"] = {"slope": s, "intercept": c, "at_32_layers": at32}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
