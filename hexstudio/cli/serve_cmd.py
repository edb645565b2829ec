"""`hexstudio serve --board NAME [--port 8000]`: an OpenAI-compatible endpoint over the board's persistent dialog.

    hexstudio serve --board sim                  # http://127.0.0.1:8000/v1, the latest run's bundle
    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=none python my_agent.py

The model is loaded once; every request is a turn of that dialog (hexstudio/serve/). Loopback only unless
--allow-remote is given together with an API key in an environment variable (--api-key-env).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
from typing import Any

from hexstudio.cli.common import CliError, add_workspace_flag, eprint, number_in
from hexstudio.cli.target import add_target_flags, board_and_bundle, model_dir_of
from hexstudio.core.atomic import write_text_atomic
from hexstudio.core.genie.conversation import TEMPLATES
from hexstudio.core.genie.runtime import RUNTIMES
from hexstudio.core.genie.session import SAMPLER_PRESETS
from hexstudio.core.secrets import remember_secret
from hexstudio.serve.limits import Limits
from hexstudio.shared.bundle.speculative import DIALOG_TYPES

# The limits flags, one a Limits field: (field, int or float, lowest, highest, metavar, help; {} is the default).
_LIMIT_FLAGS: tuple[tuple[str, type, float, float, str | None, str], ...] = (
    (
        "max_queue",
        int,
        0,
        10_000,
        None,
        "requests waiting for the dialog; more get 429 + Retry-After (default {})",
    ),
    (
        "max_connections",
        int,
        1,
        1_000_000,
        None,
        "open connections; more get 503 and are closed (default {}; capped by the open-file limit)",
    ),
    ("max_body", int, 1024, 1 << 30, "BYTES", "request body size (default {})"),
    ("header_timeout", float, 0.1, 3600, "S", "seconds to send the request headers (default {})"),
    ("body_timeout", float, 0.1, 3600, "S", "seconds to send the request body (default {})"),
    ("keep_alive", float, 0.1, 3600, "S", "seconds an idle connection is kept open (default {})"),
    (
        "shutdown_grace",
        float,
        0,
        3600,
        "S",
        "seconds a running reply gets to finish on Ctrl-C/SIGTERM (default {})",
    ),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="an OpenAI-compatible endpoint (/v1/chat/completions, /v1/completions, "
        "/v1/models, /v1/stats) over a board's persistent dialog",
    )
    add_target_flags(p, "serve this run's bundle")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, loopback only)"
    )
    p.add_argument(
        "--port", type=number_in(int, 0, 65535), default=8000, help="port (default 8000; 0 picks a free one)"
    )
    p.add_argument(
        "--allow-remote", action="store_true", help="allow a non-loopback --host (needs an API key too)"
    )
    p.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="environment variable holding the API key clients must send (required with "
        "--allow-remote; optional on loopback)",
    )
    p.add_argument("--runtime", choices=RUNTIMES, default=None, help="genie or geniex (default: the board's)")
    p.add_argument(
        "--dialog",
        choices=DIALOG_TYPES,
        default="basic",
        help="Genie's dialog: basic, or a speculative one the bundle carries (lade, spd)",
    )
    p.add_argument(
        "--sampler",
        choices=tuple(k for k in SAMPLER_PRESETS if k != "bundle"),
        default="deterministic",
        help="the sampler a request without temperature/top_p/seed gets (default deterministic)",
    )
    p.add_argument(
        "--max-tokens",
        type=number_in(int, 1, 1 << 20),
        default=256,
        help="reply budget when a request gives none (default 256)",
    )
    d = Limits()
    lim = p.add_argument_group("limits (what one client may hold or send)")
    for field, kind, lo, hi, metavar, text in _LIMIT_FLAGS:
        v = getattr(d, field)
        lim.add_argument(
            "--" + field.replace("_", "-"),
            type=number_in(kind, lo, hi),
            default=v,
            metavar=metavar,
            help=text.format(f"{v:g}" if kind is float else v),
        )
    p.add_argument(
        "--template",
        choices=TEMPLATES,
        default="auto",
        help="prompt format: auto (from the model), model (its chat template), or a hand-written one",
    )
    p.add_argument("--port-file", default=None, help="write the port here once listening (for scripts)")
    add_workspace_flag(p)
    p.set_defaults(func=cmd_serve, json=False, transcript=None)


async def _serve(args: argparse.Namespace) -> int:
    from hexstudio.core.eval.render import PromptRenderer
    from hexstudio.serve.bridge import BridgeError, DialogBridge
    from hexstudio.serve.server import BindRefused, OpenAIServer, check_bind

    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env) or None
        remember_secret(key)  # the log scrubs it (a malformed Authorization header is logged)
        if key is None:
            raise CliError(
                f"The environment variable {args.api_key_env} is not set (or empty).",
                f"export {args.api_key_env}=<a long random key>, then start the server again.",
            )
    try:
        check_bind(args.host, args.allow_remote, key)
    except BindRefused as exc:
        raise CliError(exc.message, exc.hint) from None
    if args.port_file:
        # a script waiting for the file must not read the port of an earlier server while this one loads
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.port_file)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    if main is not None:  # SIGTERM (systemctl stop) before serving ends it as Ctrl-C does: everything closed
        loop.add_signal_handler(signal.SIGTERM, _stop_before_serving, main)
    board, remote, doc, run_dir = await board_and_bundle(args)
    async with contextlib.AsyncExitStack() as opened:  # what is open, closed in reverse order however it ends
        opened.push_async_callback(board.transport.close)
        # the run's model folder, or a local bundle folder (it carries the model's tokenizer_config.json)
        model_dir = model_dir_of(args, run_dir)
        renderer = PromptRenderer.for_model(model_dir, args.template)
        model_id = str(doc.get("model") or (run_dir.name if run_dir else "bundle"))
        bridge = DialogBridge(
            board,
            remote,
            renderer,
            model_id=model_id,
            runtime=args.runtime,
            sampler=args.sampler,
            max_tokens=args.max_tokens,
            on_status=eprint,
            dialog=args.dialog,
        )
        try:
            await bridge.open()
        except BridgeError as exc:
            raise CliError(
                exc.message, "See `hexstudio board probe " + board.name + "` (the doctor)."
            ) from None
        opened.push_async_callback(bridge.close)
        limits = Limits(
            max_body=args.max_body,
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
            keep_alive=args.keep_alive,
            max_connections=_fd_budget(args.max_connections),
            max_queue=args.max_queue,
            shutdown_grace=args.shutdown_grace,
        )
        server = OpenAIServer(bridge, api_key=key, limits=limits)
        try:
            port = await server.start(args.host, args.port)
        except OSError as exc:
            raise CliError(
                f"Cannot listen on {args.host}:{args.port}: {exc.strerror or exc}.",
                "Pick another --port (or 0 for any free one).",
            ) from None
        opened.push_async_callback(server.close)
        if args.port_file:
            try:
                write_text_atomic(args.port_file, str(port))  # never seen empty or half-written
                opened.callback(_remove_port_file, args.port_file)  # a stopped server's port is no one's
            except OSError as exc:
                raise CliError(
                    f"Cannot write the port file {args.port_file}: {exc.strerror or exc}.",
                    "Give a --port-file in a folder you can write to.",
                ) from None
        sim = " — SIMULATED board: CPU numbers, not a device result" if bridge.simulated else ""
        init = bridge.inits[-1]["init_ms"] if bridge.inits else None
        eprint(f"serving {model_id} on {board.label}{sim}")
        eprint(
            f"  http://{args.host}:{port}/v1  (model loaded once in {init} ms; prompts: {renderer.label()}; "
            f"tool calls: {renderer.tool_format} format)"
        )
        eprint("  KPIs per request: x-hexstudio-* headers and GET /v1/stats; Ctrl-C stops")
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _on_stop_signal, stop, server, args.shutdown_grace)
        try:
            await stop.wait()
        finally:
            await opened.aclose()  # the server, the dialog, the board's connection
            summary: dict[str, Any] = {"served": bridge.served, "loads": len(bridge.inits)}
            eprint(f"stopped: {json.dumps(summary)}")
    return 0


def _remove_port_file(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _on_stop_signal(stop: asyncio.Event, server: Any, grace: float) -> None:
    """The first Ctrl-C (or SIGTERM) stops gracefully and says how long that may take; a second one stops now."""
    if not stop.is_set():
        eprint(f"stopping: a reply under way gets up to {grace:g} s to finish (Ctrl-C again stops it now)")
        stop.set()
    else:
        eprint("stopping now")
        server.stop_now()


def _fd_budget(wanted: int) -> int:
    """Raise the soft open-file limit toward the hard one, and keep the connection cap below it (with room
    for the board's connection, logs and the dialog's helper), so a flood of connections gets 503s instead
    of 'too many open files' for everything, /health included."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = wanted + 256
        cap = hard if hard != resource.RLIM_INFINITY else want
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, cap), hard))
            soft = min(want, cap)
        return max(1, min(wanted, int(soft) - 128))
    except (ImportError, ValueError, OSError):
        return wanted


_TERMED: list[bool] = []  # set by the SIGTERM that came before serving


def _stop_before_serving(main: asyncio.Task[int]) -> None:
    _TERMED.append(True)
    main.cancel()


def cmd_serve(args: argparse.Namespace) -> int:
    _TERMED.clear()
    try:
        return asyncio.run(_serve(args))
    except asyncio.CancelledError:
        if not _TERMED:
            raise
        eprint("stopped (SIGTERM) before serving")  # the board connected or the model loaded: all closed
        return 128 + signal.SIGTERM
