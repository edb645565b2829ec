"""The simulator's persistent chat session: the same JSON-lines protocol as the board helper
(hexstudio/workers/board/genie_session.py), over a SimDialog kept loaded between turns.

    python -m hexstudio.workers.genie_sim.session -c genie_config.json [--sampler JSON]

stdin, one JSON object a line: {"op": "query", "id": N, "prompt": TEXT, "max_tokens": N|null},
{"op": "abort"}, {"op": "reset"}, {"op": "sampler", "sampler": {...}} (seed, temp, top-k, top-p for the next
queries), {"op": "quit"} (or EOF).
stdout, one JSON object a line: {"event": "ready", ...}, {"event": "text", "id", "text", "tokens", "mono"},
{"event": "end", "id", "state", "status", "profile"}, {"event": "reset"}, {"event": "error", "code",
"message"}. Everything it reports is labeled simulated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hexstudio.workers.board.helper_io import emit
from hexstudio.workers.genie_sim.commands import OnText, serve_commands
from hexstudio.workers.genie_sim.t2t import GENIE_API_VERSION, RUNNER, GenieLoadError, SimDialog, profile_doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="genie-session (simulator)")
    p.add_argument("-c", "--config", required=True)
    p.add_argument("--sampler", default=None, help="JSON object overriding the config's sampler")
    args = p.parse_args(argv)
    sampler = json.loads(args.sampler) if args.sampler else None
    try:
        dialog = SimDialog(Path(args.config), sampler)
    except GenieLoadError as exc:  # Genie's own texts
        emit(
            {"event": "error", "code": "dialog_create_failed", "message": "\n".join([*exc.lines, exc.final])}
        )
        return 1
    except Exception as exc:
        emit(
            {
                "event": "error",
                "code": "dialog_create_failed",
                "message": f"Create From Binary FAILED! ({type(exc).__name__}: {exc})",
            }
        )
        return 1
    emit(
        {
            "event": "ready",
            "genie_version": GENIE_API_VERSION,
            "simulated": True,
            "pid": os.getpid(),
            "runner": RUNNER,
            "init_ms": round(dialog.init_us / 1000, 3),
            "context_length": dialog.capacity,
            "profile": True,
        }
    )

    def query(msg: dict[str, Any], on_text: OnText, aborted: Callable[[], bool]) -> dict[str, Any] | None:
        t0 = time.perf_counter()
        try:
            q = dialog.query(str(msg.get("prompt", "")), msg.get("max_tokens"), on_text, aborted)
        except Exception as exc:  # never leave the caller waiting for an end that will not come
            import traceback

            traceback.print_exc(file=sys.stderr)
            emit(
                {
                    "event": "error",
                    "id": msg.get("id"),
                    "code": "query_failed",
                    "message": f"the simulated query failed: {type(exc).__name__}: {exc}",
                }
            )
            return None
        state = q["state"]
        return {
            "state": state,
            "status": 4 if state == "context_full" else 0,
            "profile": None
            if state == "context_full"
            else profile_doc(dialog.init_us, q),  # as the board helper
            "n_past": q["n_past"],
            "wall_ms": round((time.perf_counter() - t0) * 1000, 3),
        }

    return serve_commands(dialog.reset, dialog.apply_sampler, query)


if __name__ == "__main__":
    raise SystemExit(main())
