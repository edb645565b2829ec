"""Peak RSS and wall time of the quantize stage against model size:
(a) whole-model QuantSim (parts=1, calibration_unit "part": one QuantSim for the whole model) vs
(b) sequential part-wise (--parts parts, default 4) with the default calibration_unit "layer" (one
QuantSim per decoder layer, the embedding (on the calibration tokens' rows) and the lm_head (in column
chunks no larger than a layer), each on the previous unit's quantized outputs).

    .venv/bin/python bench/quantize_memory.py [--sizes 20m,80m,300m] [--parts 4] [--no-validate] [--json F]

Each configuration runs the real quantize worker (`python -m hexstudio.workers.quantize`, real aimet-onnx)
in a fresh subprocess on a synthetic random-init Llama; the peak RSS is the child's ru_maxrss
(os.wait4). The baseline is the ru_maxrss of a child that only imports what the worker imports
(Python, torch, transformers, onnx, onnxruntime, aimet_onnx): the fixed overhead. Prints, for each,
peak RSS / FP16 weight bytes of the model, (peak - baseline) / FP16 bytes of the model and of the
largest part, and the ratio (b)/(a) at the largest size. With validation on, the part-wise run is
then validated (`python -m hexstudio.workers.validate`) and its peak RSS recorded the same way.
Target (issue 3): (b) flat across sizes and at most half of (a) at the largest size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hexstudio.shared.data import builtin_model_dir
from hexstudio.shared.worker_spec import WorkerSpec

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

# name: (hidden, layers, heads, kv_heads, ffn, vocab); vocab 0 = 840 (the built-in tokenizer's; a larger
# vocabulary only adds rows the calibration text never reaches, as a Llama-3 lm_head/embedding does)
SIZES = {
    "10m": (384, 8, 6, 2, 1024, 0),  # ~ 13M params (quick check)
    "20m": (512, 8, 8, 2, 1280, 0),  # ~ 22M
    "80m": (768, 12, 12, 4, 2304, 0),  # ~ 84M
    "300m": (1024, 24, 16, 4, 3072, 0),  # ~ 291M
    "270m-v32k": (1024, 16, 16, 4, 3072, 32768),  # ~ 269M, the lm_head (33.6M) 2.7x a decoder layer (12.6M)
}
BASELINE = "import torch, transformers, onnx, onnxruntime, aimet_onnx, numpy"
VALIDATE_BASELINE = "import onnxruntime, numpy, tokenizers"  # what the validate worker imports
CONTEXT, AR_N = 256, 64
SETTINGS = {
    "calibration_samples": 2,
    "calibration_seq_len": 64,
    "weight_bits": 4,
    "activation_bits": 16,
    "kv_bits": 8,
    "calibration_text": "builtin",
}

MAKE_MODEL = r"""
import sys, shutil, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
out = Path(sys.argv[1]); h, L, nh, kvh, ffn, vocab = map(int, sys.argv[2:8])
src = Path(sys.argv[8])
out.mkdir(parents=True, exist_ok=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(src / f, out / f)
from tokenizers import Tokenizer
V = max(vocab, Tokenizer.from_file(str(src / "tokenizer.json")).get_vocab_size())
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=h, num_hidden_layers=L, num_attention_heads=nh, num_key_value_heads=kvh,
                  intermediate_size=ffn, vocab_size=V, max_position_embeddings=4096, bos_token_id=0,
                  eos_token_id=1, tie_word_embeddings=False)
m = LlamaForCausalLM(cfg)
m.save_pretrained(out, safe_serialization=True)
print(sum(p.numel() for p in m.parameters()))
"""


def synthetic_model(script: str, out: Path, *shape: int) -> int:
    """Run a model-making `script` (`python -c script OUT SHAPE... BUILTIN_DIR`: it writes a random-init model
    to OUT with the built-in model's tokenizer and prints its parameter count last); the parameter count."""
    p = subprocess.run(
        [PY, "-c", script, str(out), *map(str, shape), str(builtin_model_dir())],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(p.stdout.strip().splitlines()[-1])


def make_model(root: Path, name: str) -> tuple[Path, int, int]:
    h, layers, nh, kvh, ffn, vocab = SIZES[name]
    out = root / name
    return out, synthetic_model(MAKE_MODEL, out, h, layers, nh, kvh, ffn, vocab), layers


def child_peak(argv: list[str], log: Path, cwd: Path = REPO) -> tuple[int, float, int]:
    """(exit code, wall seconds, peak RSS bytes) of a child process."""
    t0 = time.monotonic()
    with open(log.with_suffix(".out"), "wb") as so, open(log.with_suffix(".err"), "wb") as se:
        proc = subprocess.Popen(
            argv, cwd=cwd, stdout=so, stderr=se, env={**os.environ, "HEXSTUDIO_THREADS": "2"}
        )
        _, status, ru = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), time.monotonic() - t0, ru.ru_maxrss * 1024


def baseline(work: Path, code: str = BASELINE) -> int:
    rc, _, peak = child_peak([PY, "-c", code], work / "baseline")
    if rc != 0:
        raise SystemExit("the baseline import failed: " + (work / "baseline.err").read_text()[-2000:])
    return peak


def validate(run: Path) -> dict[str, float]:
    """Validate the part-wise run (its quantize output must be in artifacts/quantize)."""
    WorkerSpec.build(
        "validate",
        run,
        run / "artifacts" / "validate.partial",
        {},
        upstream={"model": run / "artifacts" / "model", "quantize": run / "artifacts" / "quantize"},
    ).write(run / "vspec.json")
    (run / "artifacts" / "validate.partial").mkdir(parents=True, exist_ok=True)
    rc, wall, peak = child_peak(
        [PY, "-m", "hexstudio.workers.validate", "--spec", str(run / "vspec.json")], run / "validate"
    )
    if rc != 0:
        raise SystemExit(
            f"validate failed for {run}:\n" + (run / "validate.err").read_text(errors="replace")[-2000:]
        )
    return {"peak_rss_bytes": peak, "wall_s": round(wall, 1)}


def measure(
    hf: Path, layers: int, parts: int, work: Path, keep_output: bool = False, unit: str = "layer"
) -> dict[str, float]:
    run = work / f"run-p{parts}"
    shutil.rmtree(run, ignore_errors=True)
    (run / "artifacts" / "model").mkdir(parents=True)
    (run / "artifacts" / "model" / "model.json").write_text(
        json.dumps(
            {
                "model": str(hf),
                "source": "local",
                "revision": None,
                "requested_revision": None,
                "hf_dir": str(hf),
                "info": {"num_layers": layers},
                "weights": {},
                "resolved": {"context_length": CONTEXT, "ar_n": AR_N, "parts": parts},
                "part_plan": {},
                "estimates": {},
            }
        )
    )
    WorkerSpec.build(
        "quantize",
        run,
        run / "artifacts" / "quantize.partial",
        {**SETTINGS, "calibration_unit": unit},
        upstream={"model": run / "artifacts" / "model"},
    ).write(run / "spec.json")
    rc, wall, peak = child_peak(
        [PY, "-m", "hexstudio.workers.quantize", "--spec", str(run / "spec.json")], run / "quantize"
    )
    if rc != 0:
        tail = (run / "quantize.err").read_text(errors="replace")[-2000:]
        raise SystemExit(f"quantize failed for {hf.name} parts={parts}:\n{tail}")
    if keep_output:
        (run / "artifacts" / "quantize.partial").rename(run / "artifacts" / "quantize")
    else:
        shutil.rmtree(run / "artifacts" / "quantize.partial", ignore_errors=True)
    return {"peak_rss_bytes": peak, "wall_s": round(wall, 1), "run": str(run)}  # type: ignore[dict-item]


def largest_unit_params(hf: Path) -> int:
    """Parameters of the largest calibration unit: the largest decoder layer (the lm_head is calibrated
    in column chunks no larger than a layer, the embedding on the rows of the calibration tokens:
    hexstudio/workers/quant/units.py); the embedding or lm_head where the model has no layer as large."""
    from safetensors import safe_open

    per: dict[str, int] = {}
    for f in hf.glob("*.safetensors"):
        with safe_open(str(f), framework="np") as sf:
            for k in sf.keys():  # noqa: SIM118
                n = int(math.prod(sf.get_slice(k).get_shape()))
                key = ("layer" + k.split(".layers.")[1].split(".")[0]) if ".layers." in k else k
                per[key] = per.get(key, 0) + n
    layers = [v for k, v in per.items() if k.startswith("layer")]
    return max(layers) if layers else max(per.values())


def largest_part_params(hf: Path, parts: int) -> int:
    """Parameters of the largest part (its layers + the embedding or the final norm and lm_head)."""
    from safetensors import safe_open

    sys.path.insert(0, str(REPO))
    from hexstudio.shared.modelinfo import layer_ranges

    sizes: dict[str, int] = {}
    for f in hf.glob("*.safetensors"):
        with safe_open(str(f), framework="np") as sf:
            for k in sf.keys():  # noqa: SIM118
                sizes[k] = int(math.prod(sf.get_slice(k).get_shape()))
    layers = 1 + max(int(k.split(".layers.")[1].split(".")[0]) for k in sizes if ".layers." in k)
    best = 0
    for i, (a, b) in enumerate(layer_ranges(layers, parts)):
        n = sum(
            v
            for k, v in sizes.items()
            if ".layers." in k and a <= int(k.split(".layers.")[1].split(".")[0]) < b
        )
        if i == 0:
            n += sum(v for k, v in sizes.items() if "embed_tokens" in k)
        if i == parts - 1:
            n += sum(
                v for k, v in sizes.items() if k.startswith("lm_head") or k.endswith("model.norm.weight")
            )
        best = max(best, n)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="20m,80m,300m", help=f"comma-separated, from {', '.join(SIZES)}")
    ap.add_argument("--parts", type=int, default=4, help="parts in the part-wise run (same for every size)")
    ap.add_argument("--no-validate", action="store_true", help="skip validating the part-wise run")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hexbench-quant-"))
    rows = []
    mib = 2**20
    try:
        base = baseline(work)
        vbase = baseline(work, VALIDATE_BASELINE)
        print(
            f"baseline (imports only): quantize {base / mib:.0f} MiB, validate {vbase / mib:.0f} MiB peak RSS",
            flush=True,
        )
        for name in args.sizes.split(","):
            hf, params, layers = make_model(work, name)
            fp16 = params * 2
            parts = min(args.parts, layers)
            part_fp16 = 2 * largest_part_params(hf, parts)
            unit_params = largest_unit_params(hf)
            a = measure(hf, layers, 1, work, unit="part")
            b = measure(hf, layers, parts, work, keep_output=not args.no_validate, unit="layer")
            v = None if args.no_validate else validate(Path(str(b["run"])))
            row = {
                "size": name,
                "params": params,
                "layers": layers,
                "parts": parts,
                "fp16_bytes": fp16,
                "largest_part_fp16_bytes": part_fp16,
                "largest_unit_params": unit_params,
                "baseline_bytes": base,
                "whole_peak": a["peak_rss_bytes"],
                "whole_wall": a["wall_s"],
                "partwise_peak": b["peak_rss_bytes"],
                "partwise_wall": b["wall_s"],
                "whole_ratio": a["peak_rss_bytes"] / fp16,
                "partwise_ratio": b["peak_rss_bytes"] / fp16,
                "whole_net_ratio": (a["peak_rss_bytes"] - base) / fp16,
                "partwise_net_ratio": (b["peak_rss_bytes"] - base) / fp16,
                "partwise_net_per_part_fp16": (b["peak_rss_bytes"] - base) / part_fp16,
                "partwise_net_bytes_per_unit_param": (b["peak_rss_bytes"] - base) / unit_params,
            }
            if v is not None:
                row.update(
                    {
                        "validate_peak": v["peak_rss_bytes"],
                        "validate_wall": v["wall_s"],
                        "validate_baseline_bytes": vbase,
                        "validate_net_per_part_fp16": (v["peak_rss_bytes"] - vbase) / part_fp16,
                    }
                )
            rows.append(row)
            print(
                f"{name:5s} {params / 1e6:6.1f}M params  fp16 {fp16 / mib:6.0f} MiB (largest of {parts} parts "
                f"{part_fp16 / mib:5.0f} MiB)\n"
                f"   (a) whole-model : peak {a['peak_rss_bytes'] / mib:6.0f} MiB  peak/fp16 {row['whole_ratio']:5.2f}"
                f"  (peak-baseline)/fp16 {row['whole_net_ratio']:5.2f}  {a['wall_s']:6.1f} s\n"
                f"   (b) part-wise   : peak {b['peak_rss_bytes'] / mib:6.0f} MiB  peak/fp16 "
                f"{row['partwise_ratio']:5.2f}  (peak-baseline)/fp16 {row['partwise_net_ratio']:5.2f}  "
                f"(peak-baseline)/largest-part fp16 {row['partwise_net_per_part_fp16']:5.2f}  "
                f"{b['wall_s']:6.1f} s\n"
                f"                     largest calibration unit {unit_params / 1e6:.1f}M params: (peak-baseline)"
                f" / its params {row['partwise_net_bytes_per_unit_param']:5.1f} bytes",
                flush=True,
            )
            if v is not None:
                print(
                    f"   validate (b)    : peak {v['peak_rss_bytes'] / mib:6.0f} MiB  (peak-baseline)/largest-part "
                    f"fp16 {row['validate_net_per_part_fp16']:5.2f}  {v['wall_s']:6.1f} s",
                    flush=True,
                )
            shutil.rmtree(hf, ignore_errors=True)
            if not args.keep:
                for r in work.glob("run-p*"):
                    shutil.rmtree(r, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    last = rows[-1]
    ratio = last["partwise_peak"] / last["whole_peak"]
    net = (last["partwise_peak"] - base) / max(last["whole_peak"] - base, 1)
    print(
        f"\n(b)/(a) peak RSS at the largest size ({last['size']}): {ratio:.2f} (net of baseline {net:.2f}); "
        f"target <= 0.50: {'met' if ratio <= 0.5 else 'NOT met'}"
    )
    print(
        "(b) peak/fp16 across sizes: "
        + ", ".join(f"{r['partwise_ratio']:.2f}" for r in rows)
        + "; (peak-baseline)/fp16: "
        + ", ".join(f"{r['partwise_net_ratio']:.2f}" for r in rows)
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "ratio_b_over_a_largest": ratio,
                    "largest_part_params": [r["largest_part_fp16_bytes"] // 2 for r in rows],
                    "net_ratio_b_over_a_largest": net,
                    "baseline_bytes": base,
                    "context_length": CONTEXT,
                    "ar_n": AR_N,
                    "settings": SETTINGS,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
