"""`hexstudio serve`: a turn-2 request must not re-initialize the dialog (target: turn-2 start / init < 0.1).

Starts `hexstudio serve` on the latest run with a bundle (default board: the run's, else sim), then with the
official openai client sends turn 1 and, several times, a turn 2 that extends it. Turn-2 start is the time
from the request reaching the dialog to its first streamed token (x-hexstudio-start-ms: queue excluded);
init is the dialog's load time at start (GET /v1/stats). Prints the median ratio against the target.

    .venv/bin/python bench/serve_turn2.py [--workspace WS] [--board sim] [--repeats 5]
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
import urllib.request
from pathlib import Path
from typing import Any

TARGET = 0.1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workspace", default=None)
    ap.add_argument("--board", default=None)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from openai import OpenAI

    port_file = Path(tempfile.mkdtemp(prefix="hexstudio-bench-")) / "port"
    argv = [sys.executable, "-m", "hexstudio", "serve", "--port", "0", "--port-file", str(port_file)]
    if args.board:
        argv += ["--board", args.board]
    env = dict(os.environ)
    if args.workspace:
        env["HEXSTUDIO_WORKSPACE"] = args.workspace
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (port_file.is_file() and port_file.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                print(proc.stderr.read() if proc.stderr else "", file=sys.stderr)
                print(
                    "hexstudio serve did not start (a run with a compiled bundle is needed: hexstudio run "
                    "--model builtin:tiny-llama --board sim --until board)",
                    file=sys.stderr,
                )
                return 1
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port_file.read_text()}/v1"
        c = OpenAI(base_url=url, api_key="none", max_retries=0)
        model = c.models.list().data[0].id
        ratios, starts, firsts = [], [], []
        for _ in range(args.repeats):
            first: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
            r1 = c.chat.completions.create(model=model, messages=first, max_tokens=16)
            msgs: list[Any] = [
                *first,
                {"role": "assistant", "content": r1.choices[0].message.content or ""},
                {"role": "user", "content": "Tell me about the workshop."},
            ]
            k2 = None
            for ch in c.chat.completions.create(model=model, messages=msgs, max_tokens=16, stream=True):
                k2 = (getattr(ch, "model_extra", None) or {}).get("hexstudio") or k2
            assert k2 is not None and k2["kv_reused"], k2
            starts.append(float(k2["start_ms"]) - float(k2.get("ttft_ms") or 0.0))
            firsts.append(float(k2["start_ms"]))
        with urllib.request.urlopen(url + "/stats") as resp:
            st = json.loads(resp.read())
        loads = st["loads"]
        init = float(loads[0]["init_ms"])
        ratios = [s / init for s in starts]
        med = statistics.median(ratios)
        tag = "SIMULATED" if st["simulated"] else "device"
        print(
            f"board {st['board_label']} [{tag}]: dialog loads {len(loads)} (init {init:.1f} ms), turn-2 start "
            f"median {statistics.median(starts):.1f} ms over {len(starts)}"
        )
        print(f"turn-2 first token (compute included) / init = {statistics.median(firsts) / init:.3f}")
        print(
            f"turn-2 start / init = {med:.3f} (target < {TARGET}) -> ratio to target {med / TARGET:.2f} "
            f"{'OK' if med < TARGET and len(loads) == 1 else 'MISSED'}"
        )
        return 0 if med < TARGET and len(loads) == 1 else 2
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    raise SystemExit(main())
