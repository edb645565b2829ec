"""The speed predictor (`hexstudio predict`, issue 28) against published device figures.

Predicts Llama-3.2-1B-Instruct and Llama-3.2-3B-Instruct (config.json from their public values, bench/configs)
for SA8775P (Hexagon v73, the QCS9075's NPU; compiled as soc_model 77 / htp_arch 73) at context 4096, AR-128,
and prints prediction / published for decode tok/s and both ends of the TTFT range. Published: Qualcomm AI Hub
perf.yaml, W4A16, context 4096 (facts/numbers.md). Goal: decode within +-25 %.

    .venv/bin/python bench/predict_vs_published.py [--workspace DIR] [--one-layer] [--json]

Heavy: it compiles 1- and 2-layer graphs at the true shapes on this machine (minutes; cached afterwards under
WORKSPACE/cache/predict).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hexstudio.core.services.predict import PredictPlan, PredictRequest, plan, run_prediction  # noqa: E402
from hexstudio.shared.predict import target_for_device  # noqa: E402

# AI Hub perf.yaml, W4A16, context 4096, SA8775P (facts/numbers.md): tok/s, TTFT ms (one 128-token pass, 4096)
PUBLISHED: dict[str, dict[str, float]] = {
    "Llama-3.2-1B-Instruct": {"tok_s": 32.61, "ttft_128_ms": 68.0, "ttft_4096_ms": 2174.0},
    "Llama-3.2-3B-Instruct": {"tok_s": 17.47, "ttft_128_ms": 110.0, "ttft_4096_ms": 3508.0},
}
SA8775P = target_for_device(
    "SA8775P ADP",
    {"soc_model": 77, "dsp_arch": "v73", "chipset": "qualcomm-sa8775p"},
    note="compiled as soc_model 77 (QCS9100/QCS9075, the same v73 SoC family)",
)


def predict(name: str, workspace: Path, two_layers: bool) -> dict[str, Any]:
    cfg = json.loads((ROOT / "bench" / "configs" / name / "config.json").read_text())
    p = plan(
        PredictRequest(model=f"meta-llama/{name}", context_length=4096, ar_n=128, two_layers=two_layers),
        config=cfg,
        boards={},
    )
    p = PredictPlan(**{**p.__dict__, "target": SA8775P})
    t0 = time.monotonic()
    doc = asyncio.run(run_prediction(p, workspace))
    doc["bench_wall_s"] = round(time.monotonic() - t0, 1)
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--workspace",
        type=Path,
        default=Path(os.environ.get("HEXSTUDIO_WORKSPACE") or Path.home() / "hexstudio-workspace"),
    )
    ap.add_argument("--one-layer", action="store_true", help="1-layer graphs only (no per-graph fixed cost)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--model", action="append", choices=sorted(PUBLISHED), help="default: both")
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for name in a.model or sorted(PUBLISHED):
        doc = predict(name, a.workspace, not a.one_layer)
        pub = PUBLISHED[name]
        tok = doc["decode_tok_s"]["full_context"]
        t128, t4096 = doc["ttft_ms"]["128"], doc["ttft_ms"]["4096"]
        row = {
            "model": name,
            "label": doc["label"],
            "parts": doc["parts"],
            "qnn_version": doc["qnn_version"],
            "predicted_tok_s": tok,
            "published_tok_s": pub["tok_s"],
            "ratio_tok_s": round(tok["value"] / pub["tok_s"], 3),
            "ratio_tok_s_bounds": [
                round(tok["lower"] / pub["tok_s"], 3),
                round(tok["upper"] / pub["tok_s"], 3),
            ],
            "predicted_ttft_128_ms": t128,
            "published_ttft_128_ms": pub["ttft_128_ms"],
            "ratio_ttft_128": round(t128["value"] / pub["ttft_128_ms"], 3),
            "predicted_ttft_4096_ms": t4096,
            "published_ttft_4096_ms": pub["ttft_4096_ms"],
            "ratio_ttft_4096": round(t4096["value"] / pub["ttft_4096_ms"], 3),
            "token": doc["token"],
            "prompt_pass": doc["prompt_pass"],
            "notes": doc["notes"],
            "graphs": doc["graphs"],
            "bench_wall_s": doc["bench_wall_s"],
        }
        rows.append(row)
        if not a.json:
            tg, pp = doc["token"], doc["prompt_pass"]
            print(
                f"{name} on {doc['target']['name']} ({doc['parts']} parts, QNN {doc['qnn_version']}), "
                f"{doc['label']}, {doc['bench_wall_s']} s:"
            )
            print(
                f"  decode   predicted {tok['value']:6.2f} tok/s ({tok['lower']:.2f}-{tok['upper']:.2f})  "
                f"published {pub['tok_s']:6.2f}  ratio {row['ratio_tok_s']:.2f} "
                f"({row['ratio_tok_s_bounds'][0]:.2f}-{row['ratio_tok_s_bounds'][1]:.2f})"
            )
            print(
                f"  TTFT 128 predicted {t128['value']:8.1f} ms ({t128['lower']:.1f}-{t128['upper']:.1f})  "
                f"published {pub['ttft_128_ms']:8.1f}  ratio {row['ratio_ttft_128']:.2f}"
            )
            print(
                f"  TTFT 4096 predicted {t4096['value']:8.1f} ms  published {pub['ttft_4096_ms']:8.1f}  "
                f"ratio {row['ratio_ttft_4096']:.2f}"
            )
            print(
                f"  per token: layers {tg['layers_ms']['value']:.1f} ms + fixed {tg['fixed_ms']['value']:.1f} + "
                f"lm_head {tg['lm_head_ms']['value']:.1f} + switch {tg['switch_ms']['value']:.1f}; DDR floor "
                f"{tg['ddr_floor_ms']['value']:.1f} ms ({tg['weight_bytes'] / 1e6:.0f} MB weights); "
                f"{tg['dominant']} dominates"
            )
            print(
                f"  per 128-token pass: layers {pp['layers_ms']['value']:.1f} ms + lm_head "
                f"{pp['lm_head_ms']['value']:.1f}; DDR floor {pp['ddr_floor_ms']['value']:.1f} ms"
            )
            for g in doc["graphs"]:
                print(
                    f"    {g['key']:58s} {g['sim_us']:9.0f} us  compile {g['compile_s']:6.1f} s  "
                    f"peak RSS {g['peak_rss_bytes'] / 2**20:6.0f} MiB{'  (cached)' if g['cached'] else ''}"
                )
    if a.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
