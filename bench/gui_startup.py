"""Cold start of the studio to its first window, and what the GUI process imported.

    .venv/bin/python bench/gui_startup.py [--repeat 5]

Runs `python -m hexstudio gui --startup-check` (offscreen unless a display is set) in fresh processes: the
wall time from spawning the process to the window's first event-loop turn, measured from outside.
Target (issue 8): under 2 s. Prints the median, the ratio to 2 s, and the heavy modules loaded
(must be none).
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    env = dict(os.environ)
    if not (env.get("DISPLAY") or env.get("WAYLAND_DISPLAY")):
        env["QT_QPA_PLATFORM"] = "offscreen"
    tmp = Path(tempfile.mkdtemp(prefix="gui-start-"))
    env["HEXSTUDIO_CONFIG_DIR"] = str(tmp / "cfg")
    walls, inner = [], []
    heavy: list[str] = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "hexstudio", "gui", "--startup-check", "--workspace", str(tmp / "ws")],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return 1
        doc = json.loads(out.stdout.strip().splitlines()[-1])
        walls.append(time.perf_counter() - t0)
        inner.append(doc["first_window_s"])
        heavy = doc["heavy_modules"]
    med = statistics.median(walls)
    print(
        f"cold start to first window: median {med:.2f} s over {args.repeat} runs (process spawn to window; "
        f"inside the process: {statistics.median(inner):.2f} s); max {max(walls):.2f} s"
    )
    print(f"heavy modules imported by the GUI process: {heavy or 'none'}")
    print(f"median / 2 s target = {med / 2:.2f} ({'meets' if med < 2 else 'MISSES'} the target)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
