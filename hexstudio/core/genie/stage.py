"""Chat stage: run the run's benchmark prompt deterministically on its board; record the KPIs."""

from __future__ import annotations

import json
from typing import Any

from hexstudio.core.device.board import BoardError
from hexstudio.core.genie.prompts import format_prompt
from hexstudio.core.genie.run import Chunk, QueryResult, load_token_counter, run_query
from hexstudio.core.genie.session import write_sampler_config
from hexstudio.core.services.chat_target import board_doc as read_board_doc
from hexstudio.core.services.chat_target import open_run_board
from hexstudio.core.settings import Settings
from hexstudio.core.stage_api import StageContext, StageError
from hexstudio.core.units import fmt_rate
from hexstudio.shared.bundle import genie_sampler_keys
from hexstudio.shared.run_settings import DEFAULTS

KPI_UNITS = {
    "init_ms": "ms",
    "prompt_tokens": "",
    "prompt_tok_s": "toks/sec",
    "ttft_ms": "ms",
    "generated_tokens": "",
    "gen_tok_s": "toks/sec",
    "gen_time_ms": "ms",
}


def run_sampler(settings: dict[str, Any]) -> dict[str, Any]:
    """The run's sampler in Genie's keys (seed, temp, top-k, top-p), the defaults where it leaves a key out: the
    Chat stage's benchmark reply is sampled with it, whatever the bundle's genie_config.json holds."""
    given = settings.get("sampler")
    merged = {**DEFAULTS.sampler, **(given if isinstance(given, dict) else {})}
    return genie_sampler_keys(merged)


def chat_record(board_name: str, prompt: str, res: QueryResult) -> dict[str, Any]:
    """chat.json: labeled simulated or device by what the runner reported (banner, profile metadata)."""
    assert res.kpis is not None
    source = "simulated" if res.simulated else "device"
    return {
        "board": board_name,
        "source": source,
        "prompt": prompt,
        "reply": res.text,
        "state": res.transcript.state,
        "kpis": res.kpis.as_json(),
        "chunks": [{"t": round(c.t, 4), "text": c.text, "tokens": c.tokens} for c in res.chunks],
        "wall_ms": round(res.wall_ms, 1),
    }


async def run_chat_stage(ctx: StageContext) -> dict[str, Any]:
    em = ctx.emitter
    board_doc = read_board_doc(ctx.upstream["board"])
    if board_doc is None:
        raise StageError(
            "no_board",
            "The Chat stage needs the board stage's result (board.json).",
            "Run the board stage again.",
        )
    try:
        board = (await open_run_board(board_doc, Settings.load(), ctx.manifest.run_dir.parent.parent)).board
    except BoardError as exc:
        raise StageError("board_unavailable", exc.message, exc.hint) from None
    model_dir = ctx.upstream.get("model")
    prompt = format_prompt(
        str(ctx.settings.get("benchmark_prompt", DEFAULTS.benchmark_prompt)),
        model_dir,
        str(ctx.settings.get("prompt_template", DEFAULTS.prompt_template)),
    )
    em.progress(0.1, f"running the benchmark prompt on {board.label}")

    def on_chunk(c: Chunk) -> None:
        em.log(c.text, level="debug")

    runtime = str(ctx.settings.get("runtime") or (board.config or {}).get("runtime") or "genie")
    if runtime != "genie":
        doc = await _chat_through_session(board, board_doc, prompt, runtime, ctx)
    else:
        count = await load_token_counter(
            board, board_doc["remote_bundle"]
        )  # each chunk's tokens, for the rate
        try:
            config = await write_sampler_config(board, board_doc["remote_bundle"], run_sampler(ctx.settings))
        except (OSError, ValueError) as exc:
            raise StageError(
                "bundle_unreadable",
                f"Cannot write the run's sampler beside the bundle on {board.label}: {exc}.",
                "Push the bundle again (the Board stage), and check the board's free space.",
            ) from None
        res = await run_query(
            board,
            board_doc["remote_bundle"],
            prompt,
            config=config,
            on_chunk=on_chunk,
            max_tokens=int(ctx.settings.get("benchmark_max_tokens", DEFAULTS.benchmark_max_tokens)),
            count_tokens=count,
        )
        if res.exit_status != 0 or res.kpis is None:
            raise StageError(
                "genie_failed",
                f"Genie failed on {board.label}: {res.error or 'no profile written'}",
                "See the Board page's doctor, or `hexstudio explain --file` on the log.",
            )
        doc = chat_record(board_doc["board"], prompt, res)
        doc["runtime"] = "genie"
        doc["runtime_version"] = (
            f"Genie API {res.transcript.genie_version}" if res.transcript.genie_version else None
        )
    source, k = doc["source"], doc["kpis"]
    (ctx.out_dir / "chat.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False))
    em.artifact("chat.json", kind="json", role="chat")
    for name, unit in KPI_UNITS.items():
        em.metric(name, k.get(name), unit=unit, scope=source)
    em.metric("source", source)
    em.metric("runtime", doc.get("runtime"))
    em.metric("runtime_version", doc.get("runtime_version"))
    rate = fmt_rate(k.get("gen_tok_s")) if k.get("gen_tok_s") is not None else "?"
    origin = " from the printed [KPIS] block" if k.get("origin") == "kpis_block" else ""
    em.progress(1.0, f"{k['generated_tokens']} tokens at {rate} tok/s ({source}{origin})")
    return {"source": source, "generated_tokens": k["generated_tokens"]}


async def _chat_through_session(
    board: Any, board_doc: dict[str, Any], prompt: str, runtime: str, ctx: StageContext
) -> dict[str, Any]:
    """The benchmark prompt through the runtime interface (hexstudio.core.genie.runtime), for runtimes other than
    Genie's one-shot genie-t2t-run: the prompt as formatted, one turn, its KPIs and the runtime's version."""
    from hexstudio.core.genie.conversation import Conversation
    from hexstudio.core.genie.session import ChatSession, SessionError

    class _Raw(Conversation):  # the prompt is already formatted by prompts.format_prompt
        def prompt_for(self, user: str) -> str:
            self.dropped_turns = 0
            return user

    s = ChatSession(
        board,
        board_doc["remote_bundle"],
        _Raw(template="qa"),
        mode="persistent",
        max_tokens=int(ctx.settings.get("benchmark_max_tokens", DEFAULTS.benchmark_max_tokens)),
        runtime=runtime,
        sampler=run_sampler(ctx.settings),
    )
    try:
        await s.open()
        r = await s.send(prompt)
    except SessionError as exc:
        raise StageError(
            "runtime_failed", f"{runtime} failed on {board.label}: {exc.message}", exc.hint
        ) from None
    finally:
        await s.close()
    if r.kpis is None or r.state == "failed":
        raise StageError(
            "runtime_failed",
            f"{runtime} failed on {board.label}: {r.error or 'no profile'}",
            "See the Board page's doctor (the GenieX check).",
        )
    k = r.kpis
    if k.init_ms is None and s.init_ms is not None:
        from dataclasses import replace

        k = replace(k, init_ms=s.init_ms)
    return {
        "board": board_doc["board"],
        "source": "simulated" if r.simulated else "device",
        "prompt": prompt,
        "reply": r.text,
        "state": r.state,
        "kpis": k.as_json(),
        "chunks": [{"t": round(c.t, 4), "text": c.text, "tokens": c.tokens} for c in r.chunks],
        "wall_ms": round(r.wall_ms, 1),
        "runtime": r.runtime,
        "runtime_version": r.runtime_version,
    }
