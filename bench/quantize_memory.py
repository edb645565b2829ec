"""Peak RSS and wall time of the quantize stage against model size:
(a) whole-model QuantSim (parts=1) vs (b) sequential part-wise (one part per layer group).

    .venv/bin/python bench/quantize_memory.py [--sizes small,medium,large] [--keep]

Each configuration runs the real quantize worker (`python -m workers.quantize`, real aimet-onnx)
in a fresh subprocess on a synthetic random-init Llama; the peak RSS is the child's ru_maxrss
(os.wait4). Prints peak RSS / FP16 weight bytes for each, and the ratio (b)/(a) at the largest
size. Target (issue 3): (b) flat across sizes and at most half of (a) at the largest size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

# name: (hidden, layers, heads, kv_heads, ffn)
SIZES = {
    "small": (384, 8, 6, 2, 1024),     # ~ 13M params
    "medium": (640, 12, 10, 2, 1792),  # ~ 48M
    "large": (896, 16, 14, 2, 2560),   # ~ 125M
}
CONTEXT, AR_N = 256, 64
SETTINGS = {"calibration_samples": 2, "calibration_seq_len": 64, "weight_bits": 4, "activation_bits": 16,
            "kv_bits": 8, "calibration_text": "builtin"}

MAKE_MODEL = r"""
import sys, shutil, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
out = Path(sys.argv[1]); h, L, nh, kvh, ffn = map(int, sys.argv[2:7])
src = Path(sys.argv[7])
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(src / f, out / f) if out.exists() else None
out.mkdir(parents=True, exist_ok=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(src / f, out / f)
from tokenizers import Tokenizer
V = Tokenizer.from_file(str(src / "tokenizer.json")).get_vocab_size()
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=h, num_hidden_layers=L, num_attention_heads=nh, num_key_value_heads=kvh,
                  intermediate_size=ffn, vocab_size=V, max_position_embeddings=4096, bos_token_id=0,
                  eos_token_id=1, tie_word_embeddings=False)
m = LlamaForCausalLM(cfg)
m.save_pretrained(out, safe_serialization=True)
print(sum(p.numel() for p in m.parameters()))
"""


def make_model(root: Path, name: str) -> tuple[Path, int, int]:
    h, layers, nh, kvh, ffn = SIZES[name]
    out = root / name
    src = REPO / "resources" / "builtin_model" / "tiny-llama"
    p = subprocess.run([PY, "-c", MAKE_MODEL, str(out), str(h), str(layers), str(nh), str(kvh), str(ffn), str(src)],
                       capture_output=True, text=True, check=True)
    return out, int(p.stdout.strip().splitlines()[-1]), layers


def measure(hf: Path, layers: int, parts: int, work: Path) -> dict[str, float]:
    run = work / f"run-p{parts}"
    shutil.rmtree(run, ignore_errors=True)
    (run / "artifacts" / "model").mkdir(parents=True)
    (run / "artifacts" / "model" / "model.json").write_text(json.dumps({
        "model": str(hf), "source": "local", "revision": None, "hf_dir": str(hf), "info": {"num_layers": layers},
        "resolved": {"context_length": CONTEXT, "ar_n": AR_N, "parts": parts}}))
    spec = {"schema": 1, "stage": "quantize", "run_dir": str(run), "out_dir": str(run / "artifacts" / "quantize.partial"),
            "upstream": {"model": str(run / "artifacts" / "model")}, "settings": SETTINGS}
    (run / "spec.json").write_text(json.dumps(spec))
    t0 = time.monotonic()
    with open(run / "stdout.log", "wb") as so, open(run / "stderr.log", "wb") as se:
        proc = subprocess.Popen([PY, "-m", "workers.quantize", "--spec", str(run / "spec.json")], cwd=REPO,
                                stdout=so, stderr=se, env={**os.environ, "HEXSTUDIO_THREADS": "2"})
        _, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = (run / "stderr.log").read_text(errors="replace")[-2000:]
        raise SystemExit(f"quantize failed for {hf.name} parts={parts}:\n{tail}")
    peak = ru.ru_maxrss * 1024
    shutil.rmtree(run / "artifacts" / "quantize.partial", ignore_errors=True)
    return {"peak_rss_bytes": peak, "wall_s": round(wall, 1)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="small,medium,large")
    ap.add_argument("--parts-per", type=int, default=2, help="layers per part in the part-wise run")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hexbench-quant-"))
    rows = []
    try:
        for name in args.sizes.split(","):
            hf, params, layers = make_model(work, name)
            fp16 = params * 2
            parts = max(2, layers // args.parts_per)
            a = measure(hf, layers, 1, work)
            b = measure(hf, layers, parts, work)
            row = {"size": name, "params": params, "layers": layers, "parts": parts, "fp16_bytes": fp16,
                   "whole_peak": a["peak_rss_bytes"], "whole_wall": a["wall_s"],
                   "partwise_peak": b["peak_rss_bytes"], "partwise_wall": b["wall_s"],
                   "whole_ratio": a["peak_rss_bytes"] / fp16, "partwise_ratio": b["peak_rss_bytes"] / fp16}
            rows.append(row)
            print(f"{name:7s} {params / 1e6:6.1f}M params  fp16 {fp16 / 2**20:7.1f} MiB | "
                  f"(a) whole-model: {a['peak_rss_bytes'] / 2**20:7.0f} MiB peak ({row['whole_ratio']:5.1f}x fp16), "
                  f"{a['wall_s']:6.1f} s | (b) part-wise ({parts} parts): {b['peak_rss_bytes'] / 2**20:7.0f} MiB "
                  f"({row['partwise_ratio']:5.1f}x fp16), {b['wall_s']:6.1f} s", flush=True)
            shutil.rmtree(hf, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    last = rows[-1]
    ratio = last["partwise_peak"] / last["whole_peak"]
    print(f"\n(b)/(a) peak RSS at the largest size ({last['size']}): {ratio:.2f}  (target <= 0.50: "
          f"{'met' if ratio <= 0.5 else 'NOT met'})")
    print("(b) peak RSS / fp16 weight bytes across sizes: " + ", ".join(f"{r['partwise_ratio']:.1f}" for r in rows))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "ratio_b_over_a_largest": ratio,
                                         "context_length": CONTEXT, "ar_n": AR_N, "settings": SETTINGS}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
