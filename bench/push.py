"""bench/push: HexStudio bundle push vs OpenSSH scp over loopback, and an unchanged re-push.

    .venv/bin/python bench/push.py [--size-mb 1024] [--files 8]

Needs root and openssh-server (a real sshd on 127.0.0.1 from tests/support/sshd.py). Writes a
synthetic bundle of random bytes (`--files` context binaries + small config files), copies it once
with `scp -r` (the anchor), then pushes it with hexstudio.core.device.push.push_bundle to a fresh folder,
then pushes it again unchanged. Prints the throughputs, their ratio (target >= 0.8) and the re-push time
(target < 2 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hexstudio.core.device.board import Board
from hexstudio.core.device.connect import connect_ssh
from hexstudio.core.device.push import push_bundle
from tests.support.evk_board import make_device_bundle
from tests.support.sshd import SshServer

FACTS = {
    "dsp_arch": "v73",
    "qairt_version": "2.45.0.260326",
    "mem_total_bytes": 64 << 30,
    "mem_available_bytes": 48 << 30,
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--files", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp:
        base = Path(tmp)
        os.environ["HEXSTUDIO_CONFIG_DIR"] = str(base / "config")
        bundle = make_device_bundle(
            base / "bundle", parts=args.files, part_bytes=(args.size_mb << 20) // args.files
        )
        total = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
        with SshServer(base / "sshd") as srv:
            dest = base / "remote"
            dest.mkdir()
            argv = srv.ssh_argv()
            scp = [
                "scp",
                "-q",
                "-r",
                "-P",
                str(srv.port),
                *argv[3:-1],
                str(bundle),
                f"root@{srv.host}:{dest / 'scp'}",
            ]
            t0 = time.perf_counter()
            subprocess.run(scp, check=True)
            t_scp = time.perf_counter() - t0

            async def push() -> tuple[float, float, int, int, float]:
                cfg = srv.key_config(user="root")
                t = await connect_ssh("bench", cfg, trust=lambda *a: True)
                board = Board("bench", t, False, config=cfg)
                t1 = time.perf_counter()
                r1 = await push_bundle(board, bundle, "bench", facts=FACTS)
                t_push = time.perf_counter() - t1
                t2 = time.perf_counter()
                r2 = await push_bundle(board, bundle, "bench", facts=FACTS)
                t_again = time.perf_counter() - t2
                await board.transport.run(["rm", "-rf", "--", r1.remote_dir])
                await t.close()
                return t_push, t_again, r1.sent_bytes, r2.sent_bytes, r1.verify_seconds

            t_push, t_again, sent1, sent2, t_verify = asyncio.run(push())
    scp_mbs = total / 1e6 / t_scp
    push_mbs = sent1 / 1e6 / t_push
    print(f"bundle: {total / 2**20:.0f} MiB in {args.files + 5} files")
    print(f"scp -r (anchor):     {t_scp:6.2f} s  {scp_mbs:7.1f} MB/s")
    print(
        f"hexstudio push:      {t_push:6.2f} s  {push_mbs:7.1f} MB/s  ratio {push_mbs / scp_mbs:.2f} (target >= 0.8)"
    )
    # push_bundle checks the sha256 of every file on the board after sending; scp checks nothing
    send_mbs = sent1 / 1e6 / max(t_push - t_verify, 1e-9)
    print(
        f"  of which sending:  {t_push - t_verify:6.2f} s  {send_mbs:7.1f} MB/s  ratio {send_mbs / scp_mbs:.2f} "
        f"(the board's sha256 check after it: {t_verify:.2f} s)"
    )
    print(
        f"unchanged re-push:   {t_again:6.3f} s  sent {sent2} bytes  ratio {t_again / 2.0:.3f} of the 2 s budget"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
