#!/usr/bin/env python3
"""HexStudio's chat helper for GenieX on the board: keeps one bundle loaded through GenieX's Python API
(the `geniex` package with its qairt plugin) and speaks the JSON-lines protocol of genie_session.py.

Copied to the board as <home>/hexstudio/bin/<digest>/geniex_session.py, with its companion module helper_io.py
beside it, and run from the bundle folder:

    python3 geniex_session.py --bundle . [--sampler JSON]

stdin: {"op": "query", "id", "prompt", "max_tokens"} | {"op": "abort"} | {"op": "reset"} | {"op": "quit"}
       | {"op": "sampler", "sampler": {seed, temp, top-k, top-p}}  (GenieX takes the sampler per generate():
         the values apply from the next query on, nothing is reloaded)
stdout: {"event": "ready", "runtime": "geniex", "runtime_version", "init_ms", "context_length", "pid"}
        {"event": "text", "id", "text", "tokens", "mono"}
        {"event": "end", "id", "state", "status", "geniex_profile": {ttft, prompt_time, decode_time (us),
         prompt_tokens, generated_tokens, prefill_speed, decoding_speed (tok/s), stop_reason}}
        {"event": "reset"} | {"event": "sampler", "applied": true, "sampler"} | {"event": "error", "code", "message"}
The prompt is sent as HexStudio formatted it (generate() applies no chat template). The user's text only
travels inside these JSON strings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Run as a package module it imports its companion by its package path; copied to the board, helper_io.py lies
# beside it in <home>/hexstudio/bin/<digest>/ (this script's folder, sys.path[0]) and is imported by its bare name.
try:
    from hexstudio.workers.board.helper_io import bad_request, emit, read_commands
except ImportError:
    from helper_io import bad_request, emit, read_commands  # type: ignore[no-redef]


def _dialog(bundle: str) -> dict:
    """genie_config.json's dialog section ({} when it cannot be read)."""
    try:
        with open(os.path.join(bundle, "genie_config.json"), encoding="utf-8") as f:
            dialog = json.load(f).get("dialog")
    except (OSError, ValueError, AttributeError):
        return {}
    return dialog if isinstance(dialog, dict) else {}


def _context_length(bundle: str) -> int | None:
    try:
        return int(_dialog(bundle)["context"]["size"])
    except (KeyError, TypeError, ValueError):
        return None


def _bundle_sampler(bundle: str) -> dict:
    """The bundle's own sampler (genie_config.json's dialog.sampler: seed, temp, top-k, top-p), what "the bundle's
    sampler" means when the studio sends none: GenieX takes the sampler per generate(), not from the config."""
    s = _dialog(bundle).get("sampler")
    return {k: s[k] for k in ("seed", "temp", "top-k", "top-p") if k in s} if isinstance(s, dict) else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="geniex_session.py")
    p.add_argument("--bundle", default=".")
    p.add_argument("--sampler", default=None, help="JSON: Genie's sampler keys (seed, temp, top-k, top-p)")
    args = p.parse_args(argv)
    bundle = os.path.abspath(args.bundle)
    sampler = json.loads(args.sampler) if args.sampler else _bundle_sampler(bundle)
    try:
        import geniex
    except ImportError as exc:
        emit(
            {
                "event": "error",
                "code": "geniex_missing",
                "message": f"the geniex Python package is not installed for {sys.executable} ({exc}): install its "
                "wheel with HexStudio's fix geniex_install",
            }
        )
        return 2
    t0 = time.perf_counter()
    try:
        model = geniex.AutoModelForCausalLM.from_pretrained(bundle, device_map="qairt")
    except Exception as exc:
        emit({"event": "error", "code": "model_load_failed", "message": f"{type(exc).__name__}: {exc}"})
        return 1
    init_ms = (time.perf_counter() - t0) * 1000
    try:
        plugin = geniex.get_plugin_version("qairt")
    except Exception:
        plugin = "unknown"
    emit(
        {
            "event": "ready",
            "runtime": "geniex",
            "simulated": False,
            "pid": os.getpid(),
            "init_ms": round(init_ms, 3),
            "runtime_version": f"GenieX python {getattr(geniex, '__version__', '?')}, qairt plugin {plugin}",
            "context_length": _context_length(bundle),
            "profile": True,
        }
    )
    current: dict = {}

    def abort() -> None:
        s = current.get("streamer")
        if s is not None:
            s.cancel()

    ops = read_commands(abort)
    while True:
        msg = ops.get()
        if msg is None or msg.get("op") == "quit":
            model.close()
            return 0
        if msg.get("op") == "reset":
            model.reset()
            emit({"event": "reset"})
            continue
        if msg.get("op") == "sampler":
            given = msg.get("sampler")
            sampler = {**sampler, **(given if isinstance(given, dict) else {})}
            emit({"event": "sampler", "applied": True, "sampler": sampler})
            continue
        if msg.get("op") != "query":
            bad_request(f"unknown op {msg.get('op')!r}")
            continue
        qid = msg.get("id")
        kw = {
            "max_new_tokens": int(msg.get("max_tokens") or 512),
            "stream": True,
            "temperature": float(sampler.get("temp", 0.0)),
            "top_k": int(sampler.get("top-k", 0)),
            "top_p": float(sampler.get("top-p", 0.0)),
            "seed": int(sampler.get("seed", 0)),
        }
        state, status, pd, why = "complete", 0, None, None
        try:
            streamer = model.generate(str(msg.get("prompt", "")), **kw)
            current["streamer"] = streamer
            for chunk in streamer:
                emit({"event": "text", "id": qid, "text": chunk, "tokens": 1, "mono": time.monotonic()})
            out = streamer.output
            prof = getattr(out, "profile", None)
            if prof is not None:
                pd = {
                    k: getattr(prof, k, None)
                    for k in (
                        "ttft",
                        "prompt_time",
                        "decode_time",
                        "prompt_tokens",
                        "generated_tokens",
                        "prefill_speed",
                        "stop_reason",
                    )
                }
                pd["decoding_speed"] = getattr(prof, "decode_speed", None)
                stop = pd.get("stop_reason")
                state = {"user": "aborted", "context_length": "context_full"}.get(str(stop), "complete")
        except Exception as exc:
            state, status, why = "failed", 1, f"{type(exc).__name__}: {exc}"
            emit({"event": "error", "code": "generate_failed", "message": why})
        finally:
            current.pop("streamer", None)
        end = {"event": "end", "id": qid, "state": state, "status": status, "geniex_profile": pd}
        emit({**end, "message": why} if why else end)  # the query's own failure, for the studio to show


if __name__ == "__main__":
    raise SystemExit(main())
