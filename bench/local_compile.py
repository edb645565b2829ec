"""Local compile of the built-in model with QNN 2.51 (onnxruntime-qnn), and real Genie's decode rate on the HTP
simulator over the result (issue 31).

    .venv/bin/python bench/local_compile.py [--runs 3] [--tokens 16] [--workspace DIR]

Builds a validated run of builtin:tiny-llama (4 calibration samples) once, then compiles it locally `--runs`
times (the Compile stage as `hexstudio run --only compile --force` runs it: the graph rewrite, one child
process per graph, the read-back through libQnnSystem) and prints the wall time, the children's peak RSS
and the context binaries' size, with the ratio to the anchor: 60 s, a budget well under one AI Hub compile
job's queue-and-compile time for the same graphs. Then one real-Genie generation of --tokens tokens on the
simulator board (SIMULATED: Qualcomm's HTP simulator on this CPU, not a device figure).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.cli import RUN_BUILTIN, python_m_hexstudio, sim_t2t_argv  # noqa: E402

ANCHOR_S = 60.0


def hexstudio(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return python_m_hexstudio(*args, env={"HEXSTUDIO_WORKSPACE": str(ws)}, timeout=3600, cwd=REPO)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--workspace", type=Path, default=None)
    args = ap.parse_args()
    ws = args.workspace or Path(tempfile.mkdtemp(prefix="hexstudio-bench-compile-"))
    # compile_target local: "auto" takes the onnxruntime stand-in where onnxruntime-qnn is missing, and this
    # bench would time that as a QNN compile (it fails instead, saying so)
    r = hexstudio(
        ws,
        *RUN_BUILTIN,
        "--until",
        "validate",
        "--set",
        "calibration_samples=4",
        "--set",
        "compile_target=local",
        "--json",
    )
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:])
        return 1
    run_id = json.loads(r.stdout)["run_id"]
    run_dir = ws / "runs" / run_id
    walls, peaks = [], []
    for _ in range(args.runs):
        t0 = time.monotonic()
        r = hexstudio(ws, "run", "--resume", run_id, "--only", "compile", "--force", "--quiet")
        walls.append(time.monotonic() - t0)
        if r.returncode != 0:
            print(r.stdout[-2000:], r.stderr[-2000:])
            return 1
        st = json.loads((run_dir / "run.json").read_text())["stages"]["compile"]
        metrics = {
            k: (m["value"] if isinstance(m, dict) else m) for k, m in (st.get("metrics") or {}).items()
        }
        peaks.append(int(metrics.get("compile_peak_rss") or 0))
    bundle = run_dir / "artifacts" / "compile" / "bundle"
    bins = sum(p.stat().st_size for p in bundle.glob("*.bin"))
    wall = statistics.median(walls)
    print(
        f"local compile of builtin:tiny-llama (4 graphs, QNN 2.51, v73 / soc_model 77): median {wall:.1f} s "
        f"(min {min(walls):.1f}, max {max(walls):.1f}) over {len(walls)} runs; children's peak RSS "
        f"{max(peaks) / 2**20:.0f} MiB; context binaries {bins / 2**20:.1f} MiB"
    )
    print(f"ratio to the anchor ({ANCHOR_S:.0f} s): {wall / ANCHOR_S:.3f}")
    r = hexstudio(ws, "run", "--resume", run_id, "--only", "board", "--quiet")
    if r.returncode != 0:  # board.json would be an earlier attempt's, or none
        print(r.stdout[-2000:], r.stderr[-2000:])
        return 1
    remote = json.loads((run_dir / "artifacts" / "board" / "board.json").read_text())["remote_bundle"]
    t0 = time.monotonic()
    p = subprocess.run(
        sim_t2t_argv(
            "The capital of France is",
            args.tokens,
            "--profile",
            str(Path(remote) / f"bench-profile-{os.getpid()}.json"),
        ),
        cwd=remote,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    wall_g = time.monotonic() - t0
    prof = json.loads((Path(remote) / f"bench-profile-{os.getpid()}.json").read_text())
    ev = next(e for e in prof["components"][0]["events"] if e["type"] == "GenieDialog_query")
    print(
        f"SIMULATED real Genie on the HTP simulator: {ev['num-generated-tokens']['value']} tokens at "
        f"{ev['token-generation-rate']['value']:.2f} tok/s, TTFT {ev['time-to-first-token']['value'] / 1000:.0f} ms "
        f"({ev['num-prompt-tokens']['value']} prompt tokens); process wall {wall_g:.1f} s; exit {p.returncode}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
