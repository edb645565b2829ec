"""Latency the SSH streaming path adds to each token's arrival, compared with reading the simulator
locally (target: median at most 5 ms).

The simulator (hexstudio.workers.genie_sim) runs the simulation bundle twice per path: on the local simulator
board (a pipe) and on a real OpenSSH server on 127.0.0.1 (tests/support/sshd.py; paramiko channel).
Producer and reader share this machine's monotonic clock, so each token's latency is exact:
arrival time in the studio minus the moment the runner wrote it. Two paths are measured:
  - genie-t2t-run (one run per turn, raw stdout through the transcript parser): the runner logs
    (time, characters so far) per token to HEXSTUDIO_SIM_TOKEN_LOG; a token has arrived when the
    parsed reply reaches its length;
  - the persistent chat session (JSON lines): each text event carries the producer's time.
Added latency = median(SSH) - median(local). Needs root and openssh-server (like the tests).

    .venv/bin/python bench/stream.py [--bundle SIMULATION_BUNDLE_DIR] [--runs 6] [--tokens 64]

Without --bundle it uses the newest compiled simulation bundle of the workspace, else builds one
(built-in model through quantize, validate, compile: a minute or two).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_MS = 5.0
PROMPT = "Question: Where does the sun rise and where does it set? Answer:"


def find_bundle(workspace: Path | None) -> Path | None:
    from hexstudio.core.runs import Workspace

    for r in Workspace(workspace).list_runs():
        b = r.path / "artifacts" / "compile" / "bundle"
        if (b / "bundle.json").is_file() and json.loads((b / "bundle.json").read_text()).get("simulated"):
            return b
    return None


def build_bundle(tmp: Path) -> Path:
    from tests.support.runs import build_validated_run
    from tests.support.sim_runs import build_compiled_sim_run

    print("no simulation bundle found: building one on the built-in model ...", flush=True)
    validated = build_validated_run(tmp / "ws-validated")
    run = build_compiled_sim_run(validated, tmp / "ws-compiled")
    return run / "artifacts" / "compile" / "bundle"


def pair(stamps: list[tuple[float, int]], arrivals: list[tuple[float, int]]) -> list[float]:
    """For each produced (time, chars-so-far), the arrival time of the first read reaching that length."""
    out = []
    j = 0
    for t_prod, n in stamps:
        while j < len(arrivals) and arrivals[j][1] < n:
            j += 1
        if j == len(arrivals):
            break
        out.append((arrivals[j][0] - t_prod) * 1000)
    return out


async def t2t_latencies(board: object, bundle: str, log: Path, runs: int, tokens: int) -> list[float]:
    from hexstudio.core.genie.run import Chunk, run_query

    lat: list[float] = []
    for i in range(runs + 1):
        arrivals: list[tuple[float, int]] = []
        total = 0

        def on_chunk(c: Chunk, arrivals: list[tuple[float, int]] = arrivals) -> None:
            nonlocal total
            total += len(c.text)
            arrivals.append((time.monotonic(), total))

        log.unlink(missing_ok=True)
        res = await run_query(board, bundle, PROMPT, on_chunk=on_chunk, max_tokens=tokens)  # type: ignore[arg-type]
        if res.exit_status != 0:
            raise SystemExit(f"the simulator failed: {res.error}\n{res.stderr}")
        stamps = [(float(t), int(n)) for t, n in json.loads(log.read_text())]
        if i:  # the first run warms caches
            lat += pair(stamps, arrivals)
    return lat


async def session_latencies(board: object, bundle: str, runs: int, tokens: int) -> list[float]:
    from hexstudio.core.genie.conversation import Conversation
    from hexstudio.core.genie.run import Chunk
    from hexstudio.core.genie.session import ChatSession

    lat: list[float] = []
    async with ChatSession(
        board,
        bundle,
        Conversation(template="qa"),
        mode="persistent",  # type: ignore[arg-type]
        max_tokens=tokens,
    ) as s:
        for i in range(runs + 1):
            got: list[float] = []

            def on_chunk(c: Chunk, got: list[float] = got) -> None:
                if c.mono is not None:
                    got.append((time.monotonic() - c.mono) * 1000)

            await s.send("Where does the sun rise?", on_chunk=on_chunk)
            await s.reset()
            if i:
                lat += got
    return lat


def summary(name: str, xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=10)
    return f"{name:<28} n={len(xs):4d}  median {statistics.median(xs):6.3f} ms  p90 {q[-1]:6.3f} ms  max {max(xs):7.3f} ms"


async def main_async(args: argparse.Namespace, tmp: Path) -> int:
    from hexstudio.core.device.board import Board
    from hexstudio.core.device.connect import connect_ssh
    from hexstudio.core.device.push import push_bundle
    from hexstudio.core.device.transport import LocalTransport
    from tests.support.sshd import SshServer, sshd_available

    ok, why = sshd_available()
    if not ok:
        raise SystemExit(f"cannot measure the SSH path: {why}")
    bundle = Path(args.bundle) if args.bundle else find_bundle(None) or build_bundle(tmp)
    local_log, ssh_log = tmp / "local-tokens.json", tmp / "ssh-tokens.json"
    sim = [sys.executable, "-m", "hexstudio.workers.genie_sim.t2t"]
    local = Board(
        "sim",
        LocalTransport(tmp / "sim-home"),
        True,
        genie_command=["env", f"HEXSTUDIO_SIM_TOKEN_LOG={local_log}", *sim],
    )
    remote_bundle = (await push_bundle(local, bundle, "bench-stream")).remote_dir
    with SshServer(tmp / "sshd") as srv:
        cfg = srv.key_config()
        t = await connect_ssh("bench", cfg, trust=lambda *_a: True)
        ssh = Board("bench-ssh", t, True, genie_command=["env", f"HEXSTUDIO_SIM_TOKEN_LOG={ssh_log}", *sim])
        try:
            print(
                f"simulation bundle {bundle}; {args.runs} runs x {args.tokens} tokens per path "
                "(SIMULATED runner: CPU)",
                flush=True,
            )
            r_local = await t2t_latencies(local, remote_bundle, local_log, args.runs, args.tokens)
            r_ssh = await t2t_latencies(ssh, remote_bundle, ssh_log, args.runs, args.tokens)
            s_local = await session_latencies(local, remote_bundle, args.runs, args.tokens)
            s_ssh = await session_latencies(ssh, remote_bundle, args.runs, args.tokens)
        finally:
            await t.close()
    print(summary("genie-t2t-run, local", r_local))
    print(summary("genie-t2t-run, over SSH", r_ssh))
    print(summary("chat session, local", s_local))
    print(summary("chat session, over SSH", s_ssh))
    added_run = statistics.median(r_ssh) - statistics.median(r_local)
    added_session = statistics.median(s_ssh) - statistics.median(s_local)
    worst = max(added_run, added_session)
    print(
        f"SSH adds per token (median): genie-t2t-run {added_run:.3f} ms, chat session {added_session:.3f} ms"
    )
    print(
        f"figure: {worst:.3f} ms added (worst path); target <= {TARGET_MS} ms; ratio {worst / TARGET_MS:.2f} "
        f"of budget -> {'OK' if worst <= TARGET_MS else 'OVER'}"
    )
    return 0 if worst <= TARGET_MS else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--bundle", default=None, help="a simulation bundle folder (default: the workspace's newest)"
    )
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hexstudio-bench-stream-"))
    os.environ.setdefault("HEXSTUDIO_CONFIG_DIR", str(tmp / "config"))  # trust the test sshd's key here only
    try:
        return asyncio.run(main_async(args, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
