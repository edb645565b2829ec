"""genie-t2t-run's command line over Qualcomm's real libGenie on this machine (the x86 HTP simulator).

No registry package ships genie-t2t-run for x86, but the onnxruntime-qnn wheel ships libGenie.so (Genie
1.21). This driver takes genie-t2t-run's flags and prints its transcript form (banner, `[PROMPT]:`,
`[BEGIN]:` the streamed reply `[END]`, `--profile` = GenieProfile's JSON), calling libGenie through the
same ctypes binding as the board helper (hexstudio/workers/board/genie_session.py). The simulator board's
`genie-t2t-run` (hexstudio.workers.genie_sim.t2t) hands over to it when a bundle holds real context binaries.

Everything it prints is labeled simulated: the HTP runs in Qualcomm's simulator, on the CPU.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from hexstudio.workers.board import genie_session as gs
from hexstudio.workers.genie_sim.t2t_args import build_parser
from hexstudio.workers.qnn.libs import INSTALL_HINT, find_qnn_libs, x86_engine_overrides


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    libs = find_qnn_libs()
    if libs is None:
        print(f"ERROR: Qualcomm's libGenie.so is not installed. {INSTALL_HINT}", file=sys.stderr)
        return 1
    for flag in ("lora", "save", "restore"):
        if getattr(args, flag) is not None:
            print(
                f"ERROR: --{flag} is not supported by HexStudio's simulator board (bundles carry no LoRA "
                "adapters, and dialog state is not saved). Run without it.",
                file=sys.stderr,
            )
            return 1
    if args.profile and os.path.exists(args.profile):
        print(
            f"ERROR: Invalid --profile argument. Output file {args.profile} already exists.", file=sys.stderr
        )
        return 1
    try:
        cfg = json.loads(Path(args.config).read_text(encoding="utf-8"))
        gs.merge_engines(cfg.setdefault("dialog", {}), x86_engine_overrides(os.cpu_count() or 1))
    except (OSError, ValueError, AttributeError) as exc:
        print(f"ERROR: Cannot read {args.config}: {exc}", file=sys.stderr)
        return 1
    unsafe = gs.check_config_paths(cfg, os.path.dirname(os.path.abspath(args.config)))
    if unsafe is not None:
        print(f"ERROR: {unsafe}", file=sys.stderr)
        return 1
    prompt = args.prompt if args.prompt is not None else Path(args.prompt_file).read_text(encoding="utf-8")
    fns = gs.bind(ctypes.CDLL(str(libs.genie)))
    version = ".".join(str(fns[f"Genie_getApi{p}Version"]()) for p in ("Major", "Minor", "Patch"))
    print(
        f"Using libGenie.so version {version} (Qualcomm's libGenie on the HTP simulator, x86: simulated, "
        "not a device)",
        flush=True,
    )

    def to_stderr(level: str, text: str) -> None:
        print(f'[{level.upper()}]  "{text}"', file=sys.stderr, flush=True)

    end: dict[str, Any] = {}

    def events(obj: dict[str, Any]) -> None:  # the helper's JSON events become genie-t2t-run's output:
        if obj.get("event") == "log":  # Genie's own log lines go to stderr as genie-t2t-run prints them,
            to_stderr(str(obj.get("level", "info")), str(obj.get("message", "")))
        elif obj.get("event") == "text":  # the reply's text to stdout as it streams,
            sys.stdout.write(str(obj.get("text", "")))
            sys.stdout.flush()
        elif obj.get("event") == "end":  # and the query's end decides [END] or [ABORT]
            end.update(obj)
            if obj.get("overran"):
                # the helper's overrun guard ends this process next (os._exit): the transcript ends here
                sys.stdout.write("[END]\n")
                sys.stdout.flush()

    gs.emit = events
    try:
        h = gs.Helper(fns, json.dumps(cfg), args.log or "warn")
    except gs.ConfigRefused as exc:  # the config, as genie-t2t-run says it: not a model that failed to load
        print(str(exc), file=sys.stderr, flush=True)
        print("Failed to create the dialog config.", flush=True)
        return 1
    except RuntimeError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        print("Failure to initialize model", flush=True)
        print("Failed to create the dialog.", flush=True)
        return 1
    print(f"\n[PROMPT]: {prompt}\n", flush=True)
    sys.stdout.write("[BEGIN]: ")
    sys.stdout.flush()
    if args.action == "ABORT":

        def later() -> None:
            time.sleep((args.sleep or 0) / 1000)
            while not h.in_query.is_set() and not end:  # the signal only reaches a query that has started
                time.sleep(0.005)
            h.abort()

        threading.Thread(target=later, daemon=True).start()
    # genie-t2t-run's budget is the config's dialog.max-num-tokens; handed to the helper's query loop, its
    # overrun guard also ends a lade dialog (Genie 1.21's lade ignores the limit: docs/genie.md)
    budget = args.max_tokens or cfg["dialog"].get("max-num-tokens")
    # the one query loop the board's helper uses (hexstudio/workers/board)
    h.query("t2t", prompt, int(budget) if isinstance(budget, int) and budget > 0 else None)
    st = int(end.get("status", -1))
    if end.get("state") == "aborted":
        sys.stdout.write("[ABORT]: \nQuery successfully aborted\n")
    elif not end.get(
        "overran"
    ):  # an overrun wrote its [END] already (the dialog then ended within the grace)
        sys.stdout.write("[END]\n")
    sys.stdout.flush()
    if st == gs.WARNING_CONTEXT_EXCEEDED:
        to_stderr("warn", "context full: the prompt and reply do not fit in the context length")
    if args.profile:
        prof = h.profile_json()
        if isinstance(prof, dict):
            # GenieProfile's metadata holds a timestamp only: the figures are the HTP simulator's, and say so
            meta = prof.setdefault("metadata", {})
            meta.update(simulated=True, runtime="Qualcomm libGenie on the HTP simulator (x86)")
        Path(args.profile).write_text(json.dumps(prof if prof is not None else {}, indent=2))
    h.close()
    if st == gs.WARNING_CONTEXT_EXCEEDED:
        # as Qualcomm's genie-t2t-run does with this status (neither success, abort nor pause): main.cpp throws
        # "Failed to query." and exits with EXIT_FAILURE
        sys.stderr.write("Failed to query.\n")
        return 1
    return 0 if st >= 0 else 1


if __name__ == "__main__":
    sys.exit(main())
