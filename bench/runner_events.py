"""How many worker events per second the job runner parses (target: >= 50,000 events/s).

A pre-generated stream of protocol lines is piped through `cat` as the "worker", so the
figure is the runner's own cost: reading the pipe, parsing + validating each event,
writing the stage log, and calling the event handler. Run: .venv/bin/python bench/runner_events.py
"""

from __future__ import annotations

import asyncio
import io
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hexstudio.core.jobs import JobRunner
from hexstudio.shared.protocol import Emitter

TARGET = 50_000
N = 300_000


def make_stream(path: Path) -> None:
    buf = io.StringIO()
    em = Emitter(buf)
    for i in range(N):
        if i % 3 == 0:
            em.progress(i / N, f"calibrating sample {i}")
        elif i % 3 == 1:
            em.log(f"part 1/5 sample {i}: loss 0.0123")
        else:
            em.metric("kl_divergence", 0.0012, unit="")
    em.done(True, {})
    path.write_text(buf.getvalue())


async def measure(stream: Path, log: Path) -> tuple[float, int]:
    count = 0

    def on_event(_ev: dict[str, object]) -> None:
        nonlocal count
        count += 1

    runner = JobRunner()
    t0 = time.perf_counter()
    job = await runner.start_argv(["cat", str(stream)], on_event=on_event, log_path=log)
    res = await job.wait()
    dt = time.perf_counter() - t0
    assert res.ok, res.message
    return dt, count


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        stream = Path(d) / "events.jsonl"
        make_stream(stream)
        best = 0.0
        for _ in range(3):
            dt, count = asyncio.run(measure(stream, Path(d) / "stage.jsonl"))
            assert count == N + 1
            best = max(best, count / dt)
    print(f"runner parses {best:,.0f} events/s (best of 3, {N:,} events incl. log writing)")
    print(f"ratio to target {TARGET:,} events/s: {best / TARGET:.2f}x")


if __name__ == "__main__":
    main()
