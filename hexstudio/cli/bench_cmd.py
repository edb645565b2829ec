"""`hexstudio bench --board NAME`: warm-up + N runs per prompt length and context fill, for every runtime the
board has (hexstudio.core.genie.bench); results into the run (<run>/artifacts/bench/bench.json), published figures
beside them labeled as published."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from hexstudio.cli.common import CliError, eprint, int_in, number_in, print_json, set_action
from hexstudio.cli.target import add_target_flags, board_and_bundle
from hexstudio.core.genie.runtime import RUNTIMES


def _ints(text: str) -> tuple[int, ...]:
    """Prompt lengths: whole numbers of tokens, 1 or more, comma-separated."""
    out = tuple(int_in(1, 1 << 20)(x) for x in text.split(",") if x.strip())
    if not out:
        raise argparse.ArgumentTypeError("give at least one length, e.g. 32,128")
    return out


def _floats(text: str) -> tuple[float, ...]:
    """Context fills: fractions from 0 up to (not including) 1, comma-separated."""
    out = tuple(number_in(float, 0.0, 0.99)(x) for x in text.split(",") if x.strip())
    if not out:
        raise argparse.ArgumentTypeError("give at least one fill, e.g. 0,0.5")
    return out


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark the model on a board: init, TTFT, prefill and decode rates "
        "(median ± spread) for each runtime it has",
    )
    add_target_flags(p, "take the bundle from this run and store the results in it")
    p.add_argument(
        "--runtimes",
        default=None,
        help=f"comma-separated, of {', '.join(RUNTIMES)} (default: those the doctor finds on the board)",
    )
    p.add_argument("--runs", type=int_in(1, 1000), default=3, help="measured runs per cell (default 3)")
    p.add_argument(
        "--warmup", type=int_in(0, 100), default=1, help="warm-up runs per cell, discarded (default 1)"
    )
    p.add_argument("--prompt-lengths", type=_ints, default=(32, 128), help="prompt tokens, e.g. 32,128")
    p.add_argument("--fills", type=_floats, default=(0.0, 0.5), help="context already filled, e.g. 0,0.5")
    p.add_argument(
        "--gen-tokens", type=int_in(1, 1 << 20), default=32, help="tokens generated per run (default 32)"
    )
    p.add_argument("--init-runs", type=int_in(1, 100), default=2, help="model loads timed (default 2)")
    set_action(p, cmd_bench, workspace=True)


async def _runtimes_on(board: Any) -> list[str]:
    """Genie always (the board stage needs it); GenieX when the doctor finds it (always on the simulator)."""
    from hexstudio.core.device.doctor import probe

    found = ["genie"]
    rep = await probe(board, only=None if board.simulated else ["geniex"])
    gx = next((c for c in rep.checks if c.id == "geniex"), None)
    if gx is not None and gx.status == "ok":
        found.append("geniex")
    return found


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from hexstudio.core.genie.bench import BenchPlan, SessionRunner, run_bench

    board, remote, _doc, run_dir = await board_and_bundle(args)
    runtimes = [r.strip() for r in args.runtimes.split(",")] if args.runtimes else await _runtimes_on(board)
    bad = [r for r in runtimes if r not in RUNTIMES]
    if bad:
        raise CliError(f"Unknown runtime(s): {', '.join(bad)}.", f"Use {', '.join(RUNTIMES)}.")
    plan = BenchPlan(
        tuple(args.prompt_lengths), tuple(args.fills), args.warmup, args.runs, args.gen_tokens, args.init_runs
    )

    def maker(rt: str) -> Any:
        async def make() -> SessionRunner:
            return SessionRunner(board, remote, rt)

        return make

    say = None if args.json else eprint
    try:
        doc = await run_bench([maker(r) for r in runtimes], plan, say)
    except Exception as exc:
        msg = getattr(exc, "message", None) or str(exc)
        raise CliError(
            f"The benchmark failed on {board.label}: {msg}",
            getattr(exc, "hint", None) or "Run `hexstudio board probe` for the runtime's check.",
        ) from None
    doc["board"] = board.name
    doc["board_label"] = board.label
    doc["bundle"] = remote
    if run_dir is not None:
        out = Path(run_dir) / "artifacts" / "bench"
        out.mkdir(parents=True, exist_ok=True)
        stamp = doc["created"].replace(":", "").replace("-", "")[:15]
        from hexstudio.core.atomic import write_json_atomic

        # whole or not at all: the run's report reads bench.json
        write_json_atomic(out / f"bench-{stamp}.json", doc)
        write_json_atomic(out / "bench.json", doc)
        doc["stored"] = str(out / "bench.json")
    return doc


def cmd_bench(args: argparse.Namespace) -> int:
    from hexstudio.core.genie.bench import report_text

    doc = asyncio.run(_bench(args))
    if args.json:
        print_json(doc)
    else:
        print(report_text(doc))
        if doc.get("stored"):
            print(f"stored in {doc['stored']}")
    return 0
