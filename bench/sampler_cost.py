"""CPU cost of the RSS/VRAM sampler at 4 Hz on a process tree (target: < 1% of one core).

Starts a worker-like tree (a parent with 4 sleeping children), samples it at 4 Hz for
20 s on an asyncio loop exactly as the job runner does, and reports the CPU time the
sampling process used divided by wall time. Run: .venv/bin/python bench/sampler_cost.py
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hexstudio.core.sampler import TreeSampler, sample_periodically

TARGET = 0.01
SECONDS = 20.0
HZ = 4.0

TREE = (
    "import subprocess, sys, time\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']) for _ in range(4)]\n"
    "time.sleep(120)\n"
)


async def run(pid: int) -> tuple[float, int]:
    sampler = TreeSampler(pid)
    await asyncio.sleep(1.0)  # let the tree start
    c0 = time.process_time()
    t0 = time.perf_counter()
    task = asyncio.ensure_future(sample_periodically(sampler, HZ))
    await asyncio.sleep(SECONDS)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    cpu = time.process_time() - c0
    wall = time.perf_counter() - t0
    return cpu / wall, len(sampler.samples)


def main() -> None:
    proc = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)
    try:
        frac, n = asyncio.run(run(proc.pid))
    finally:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
    print(
        f"sampler at {HZ:g} Hz over a 6-process tree: {frac * 100:.3f}% of one core ({n} samples in {SECONDS:g} s)"
    )
    print(
        f"ratio to target ({TARGET * 100:.0f}% of one core): {frac / TARGET:.3f} (below 1 is within target)"
    )


if __name__ == "__main__":
    main()
