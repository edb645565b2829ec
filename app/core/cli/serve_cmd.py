"""`hexstudio serve --board NAME [--port 8000]`: an OpenAI-compatible endpoint over the board's persistent dialog.

    hexstudio serve --board sim                  # http://127.0.0.1:8000/v1, the latest run's bundle
    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=none python my_agent.py

The model is loaded once; every request is a turn of that dialog (app/core/serve/). Loopback only unless
--allow-remote is given together with an API key in an environment variable (--api-key-env).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from typing import Any

from app.core.cli.common import CliError, add_workspace_flag, eprint
from app.core.genie.runtime import RUNTIMES
from app.core.genie.session import SAMPLER_PRESETS


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible endpoint (/v1/chat/completions, /v1/completions, "
                                     "/v1/models, /v1/stats) over a board's persistent dialog")
    p.add_argument("--board", default=None, help="board name from settings, or sim (default: the run's board)")
    p.add_argument("--run", default=None, help="serve this run's bundle (default: the latest run with one)")
    p.add_argument("--bundle", default=None, help="a bundle folder (local: pushed first; else on the board)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --host (needs an API key too)")
    p.add_argument("--api-key-env", default=None, metavar="VAR",
                   help="environment variable holding the API key clients must send (required with "
                        "--allow-remote; optional on loopback)")
    p.add_argument("--runtime", choices=RUNTIMES, default=None, help="genie or geniex (default: the board's)")
    p.add_argument("--sampler", choices=tuple(k for k in SAMPLER_PRESETS if k != "bundle"), default="deterministic",
                   help="the sampler a request without temperature/top_p/seed gets (default deterministic)")
    p.add_argument("--max-tokens", type=int, default=256, help="reply budget when a request gives none")
    p.add_argument("--template", default="auto", help="prompt format: auto (from the model), model, plain, qa")
    p.add_argument("--port-file", default=None, help="write the port here once listening (for scripts)")
    add_workspace_flag(p)
    p.set_defaults(func=cmd_serve, json=False, transcript=None)


async def _serve(args: argparse.Namespace) -> int:
    from app.core.cli.chat_cmd import _target
    from app.core.eval.render import PromptRenderer
    from app.core.serve.bridge import BridgeError, DialogBridge
    from app.core.serve.server import BindRefused, OpenAIServer, check_bind

    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env) or None
        if key is None:
            raise CliError(f"The environment variable {args.api_key_env} is not set (or empty).",
                           f"export {args.api_key_env}=<a long random key>, then start the server again.")
    try:
        check_bind(args.host, args.allow_remote, key)
    except BindRefused as exc:
        raise CliError(exc.message, exc.hint) from None
    board, remote, doc, run_dir = await _target(args)
    model_dir = run_dir / "artifacts" / "model" if run_dir is not None else None
    renderer = PromptRenderer.for_model(model_dir if model_dir is not None and model_dir.is_dir() else None,
                                        args.template)
    model_id = str(doc.get("model") or (run_dir.name if run_dir else "bundle"))
    bridge = DialogBridge(board, remote, renderer, model_id=model_id, runtime=args.runtime, sampler=args.sampler,
                          max_tokens=args.max_tokens, on_status=eprint)
    try:
        await bridge.open()
    except BridgeError as exc:
        await board.transport.close()
        raise CliError(exc.message, "See `hexstudio board probe " + board.name + "` (the doctor).") from None
    server = OpenAIServer(bridge, api_key=key)
    try:
        port = await server.start(args.host, args.port)
    except OSError as exc:
        await bridge.close()
        await board.transport.close()
        raise CliError(f"Cannot listen on {args.host}:{args.port}: {exc.strerror or exc}.",
                       "Pick another --port (or 0 for any free one).") from None
    if args.port_file:
        with open(args.port_file, "w", encoding="utf-8") as f:
            f.write(str(port))
    sim = " — SIMULATED board: CPU numbers, not a device result" if bridge.simulated else ""
    init = bridge.inits[-1]["init_ms"] if bridge.inits else None
    eprint(f"serving {model_id} on {board.label}{sim}")
    eprint(f"  http://{args.host}:{port}/v1  (model loaded once in {init} ms; prompts: {renderer.label()}; "
           f"tool calls: {renderer.tool_format} format)")
    eprint("  KPIs per request: x-hexstudio-* headers and GET /v1/stats; Ctrl-C stops")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.close()
        await bridge.close()
        await board.transport.close()
        summary: dict[str, Any] = {"served": bridge.served, "loads": len(bridge.inits)}
        eprint(f"stopped: {json.dumps(summary)}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    return asyncio.run(_serve(args))
