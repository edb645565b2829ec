"""`hexstudio chat --board NAME [--bundle DIR] [--prompt TEXT]`: talk to the model on a board.

Without --prompt it is interactive (one line a message; /new clears the history, /quit or Ctrl-D ends).
The model stays loaded between turns when the board can run the chat helper; otherwise every turn
runs genie-t2t-run again (and says so).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Any

from hexstudio.cli.common import EXIT_USAGE, CliError, eprint, int_in, print_json, set_action
from hexstudio.cli.target import add_target_flags, board_and_bundle, model_dir_of
from hexstudio.core.genie.conversation import TEMPLATES, Conversation
from hexstudio.core.genie.journal import ChatJournal
from hexstudio.core.genie.prompts import chat_format_for, template_for
from hexstudio.core.genie.run import Chunk
from hexstudio.core.genie.runtime import RUNTIMES
from hexstudio.core.genie.session import (
    MODES,
    SAMPLER_PRESETS,
    ChatSession,
    SessionError,
    TurnResult,
    template_for_bundle,
)
from hexstudio.core.units import fmt_ms, fmt_rate
from hexstudio.shared.bundle.speculative import DIALOG_TYPES


async def _read_line(loop: asyncio.AbstractEventLoop) -> str:
    """A line of stdin, read in a daemon thread: Ctrl+C at the `you>` prompt ends the chat at once (a read in the
    loop's executor held the exit until Enter, asyncio.run joining its thread)."""
    got: asyncio.Future[str] = loop.create_future()

    def deliver(line: str) -> None:
        if not got.done():
            got.set_result(line)

    def read() -> None:
        line = sys.stdin.readline()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the chat is over
            loop.call_soon_threadsafe(deliver, line)

    threading.Thread(target=read, name="chat-stdin", daemon=True).start()
    return await got


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "chat", help="chat with the model on a board (streams the reply, shows TTFT and tok/s)"
    )
    add_target_flags(p, "take the bundle from this run")
    p.add_argument("--prompt", default=None, help="one message, then exit (default: interactive)")
    p.add_argument(
        "--template", choices=TEMPLATES, default="auto", help="prompt template (default: from the model)"
    )
    p.add_argument("--system", default="", help="system text")
    p.add_argument(
        "--thinking",
        choices=("on", "off"),
        default=None,
        help="the chat template's thinking switch (enable_thinking, or Nemotron's system text), where "
        "it has one (default: off)",
    )
    p.add_argument(
        "--max-tokens", type=int_in(1, 1 << 20), default=256, help="reply budget in tokens (default 256)"
    )
    p.add_argument(
        "--sampler",
        choices=tuple(SAMPLER_PRESETS),
        default=None,
        help="deterministic (seed 42, temp 0, top-k 1, top-p 1; the default), thinking (Nemotron "
        "reasoning on: 0.6/40/0.95; the default with that template) or bundle (the bundle's own)",
    )
    p.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=None,
        help='genie or geniex (default: the board\'s "runtime" setting, else genie); the same pushed '
        "bundle serves both",
    )
    p.add_argument(
        "--dialog",
        choices=DIALOG_TYPES,
        default="basic",
        help="Genie's dialog: basic, or a speculative one the bundle carries (lade: lookahead; spd: a draft "
        "model); the reply KPIs then show the tokens accepted per step",
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default="auto",
        help="persistent keeps the model loaded between turns; per_turn runs genie-t2t-run each turn; "
        "auto (default) tries persistent and falls back",
    )
    p.add_argument("--transcript", type=Path, default=None, help="save the conversation (.md or .json)")
    set_action(p, cmd_chat, workspace=True)


def _template(args: argparse.Namespace, doc: dict[str, Any], model_dir: Path | None) -> str:
    if args.template != "auto":
        return str(args.template)
    if model_dir is not None:
        t = template_for(model_dir)  # the model's own chat template
        return "nemotron-reasoning-off" if t == "nemotron" else t
    return template_for_bundle(doc) if doc else "llama3"


def _kpi_line(r: TurnResult) -> str:
    k = r.kpis
    tag = "SIMULATED" if r.simulated else "device"
    if k is None:
        return f"[{tag}] no profile for this turn"
    init = "model kept loaded" if r.mode == "persistent" and not k.init_ms else f"init {fmt_ms(k.init_ms)} ms"
    return (
        f"[{tag} · {r.runtime} · {r.mode}] TTFT {fmt_ms(k.ttft_ms)} ms · prompt {'—' if k.prompt_tokens is None else k.prompt_tokens} tok at "
        f"{fmt_rate(k.prompt_tok_s)} tok/s · {k.generated_tokens} tok at {fmt_rate(k.gen_tok_s)} tok/s · {init}"
        + (
            f" · {k.accepted_per_step:.2f} tokens accepted per step"
            + (" (from token times)" if k.accepted_source == "token times" else "")
            if k.accepted_per_step is not None
            else ""
        )
    )


async def _chat(args: argparse.Namespace) -> int:
    board, remote, doc, run_dir = await board_and_bundle(args)
    model_dir = model_dir_of(args, run_dir)
    conv = Conversation(template=_template(args, doc, model_dir), system=args.system)
    if model_dir is not None:  # the model's chat template, stop ids and thinking switch
        conv.chat_format = chat_format_for(model_dir)
        if conv.chat_format.thinking_switch:
            conv.thinking = args.thinking == "on"
    sampler = args.sampler or ("thinking" if conv.template == "nemotron-reasoning-on" else "deterministic")
    try:
        session = ChatSession(
            board,
            remote,
            conv,
            mode=args.mode,
            max_tokens=args.max_tokens,
            sampler=sampler,
            on_status=None if args.json else eprint,
            runtime=args.runtime,
            dialog=args.dialog,
        )
    except SessionError as exc:
        raise CliError(exc.message, exc.hint) from None
    if run_dir is not None:  # the turns go into the run, for its report (<run>/chats/)
        session.on_turn = ChatJournal(run_dir, session, board.label).record
    results: list[dict[str, Any]] = []
    try:
        try:
            mode = await session.open()
        except SessionError as exc:
            raise CliError(exc.message, exc.hint) from None
        if not args.json:
            sim = " — SIMULATED: CPU numbers, not a device result" if session.simulated else ""
            what = (
                conv.chat_format.label(conv.thinking)
                if conv.template == "model" and conv.chat_format
                else conv.template
            )
            eprint(
                f"chat on {board.label} with {session.runtime.title} [{session.runtime_version or '?'}] "
                f"({mode}; template {what}; context {conv.context_length} tokens){sim}"
            )
            if session.fallback_reason:
                eprint(f"note: {session.fallback_reason}")

        async def turn(text: str) -> TurnResult:
            def on_chunk(c: Chunk) -> None:
                if not args.json:
                    sys.stdout.write(c.text)
                    sys.stdout.flush()

            try:
                r = await session.send(text, on_chunk=on_chunk)
            except SessionError as exc:
                raise CliError(exc.message, exc.hint) from None
            except ValueError as exc:
                raise CliError(
                    str(exc), "Shorten the message or raise the context length at compile time."
                ) from None
            if args.json:
                results.append({"user": text, **r.as_json()})
            else:
                sys.stdout.write("\n")
                if r.note:
                    eprint(f"note: {r.note}")
                if r.error:
                    eprint(f"error: {r.error}")
                eprint(_kpi_line(r))
            return r

        if args.prompt is not None:
            r = await turn(args.prompt)
            rc = 0 if r.state == "complete" else 1
        else:
            rc = 0
            loop = asyncio.get_running_loop()
            while True:
                if not args.json:
                    sys.stdout.write("you> ")
                    sys.stdout.flush()
                line = await _read_line(loop)
                if not line:
                    break
                text = line.rstrip("\n")
                if text.strip() in ("/quit", "/exit"):
                    break
                if text.strip() == "/new":
                    await session.reset()
                    eprint("new chat: history cleared")
                    continue
                if not text.strip():
                    continue
                r = await turn(text)
                rc = 0 if r.state == "complete" else 1
    finally:
        await session.close()
        await board.transport.close()
    if args.transcript is not None:
        try:
            conv.save(args.transcript)
        except OSError as exc:  # the chat is over: its replies still go out below
            eprint(f"error: the transcript could not be written to {args.transcript}: {exc.strerror or exc}")
            rc = rc or 1
    if args.json:
        print_json(
            {
                "ok": rc == 0,
                "board": board.name,
                "simulated": session.simulated,
                "mode": session.mode,
                "sampler": sampler,
                "fallback_reason": session.fallback_reason,
                "template": conv.template,
                "context_length": conv.context_length,
                "turns": results,
            }
        )
    return rc


def _check_transcript(path: Path) -> None:
    """Before the chat: a transcript that could not be written would fail after it, its replies lost with it."""
    folder = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
    if path.is_dir() or folder is None or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise CliError(
            f"--transcript {path}: "
            + ("that is a folder." if path.is_dir() else f"{folder or path.parent} cannot be written to."),
            "Give a file path (.md or .json) in a folder you can write to.",
            exit_code=EXIT_USAGE,
        )


def cmd_chat(args: argparse.Namespace) -> int:
    if args.transcript is not None:
        _check_transcript(args.transcript)
    return asyncio.run(_chat(args))
