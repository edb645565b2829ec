"""`python -m tests.aihub_emulator [--port N]`: serve the EMULATED AI Hub until Ctrl+C."""

from __future__ import annotations

import argparse
import time

from tests.aihub_emulator.server import AIHubEmulator


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.aihub_emulator")
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free one)")
    ap.add_argument("--run-seconds", type=float, default=2.0, help="how long each job runs")
    args = ap.parse_args()
    with AIHubEmulator(run_s=args.run_seconds, port=args.port) as emu:
        print(f"EMULATED AI Hub at {emu.api_url} (token {emu.token}); Ctrl+C stops it.", flush=True)
        print(
            f"export HEXSTUDIO_AIHUB_TOKEN={emu.token} HEXSTUDIO_AIHUB_API_URL={emu.api_url} "
            "NO_PROXY=127.0.0.1,localhost",
            flush=True,
        )
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
