"""Chat stage: run the run's benchmark prompt deterministically on its board; record the KPIs."""

from __future__ import annotations

import json
from typing import Any

from app.core.device.board import BoardError, open_board
from app.core.genie.prompts import format_prompt
from app.core.genie.run import Chunk, QueryResult, load_token_counter, run_query
from app.core.pipeline import StageContext, StageError
from app.core.settings import Settings

KPI_UNITS = {"init_ms": "ms", "prompt_tokens": "", "prompt_tok_s": "toks/sec", "ttft_ms": "ms",
             "generated_tokens": "", "gen_tok_s": "toks/sec", "gen_time_ms": "ms"}


def chat_record(board_name: str, prompt: str, res: QueryResult) -> dict[str, Any]:
    """chat.json: labeled simulated or device by what the runner reported (banner, profile metadata)."""
    assert res.kpis is not None
    source = "simulated" if res.simulated else "device"
    return {"board": board_name, "source": source, "prompt": prompt, "reply": res.text,
            "state": res.transcript.state, "kpis": res.kpis.as_json(),
            "chunks": [{"t": round(c.t, 4), "text": c.text, "tokens": c.tokens} for c in res.chunks],
            "wall_ms": round(res.wall_ms, 1)}


async def run_chat_stage(ctx: StageContext) -> dict[str, Any]:
    em = ctx.emitter
    board_doc = json.loads((ctx.upstream["board"] / "board.json").read_text())
    try:
        board = await open_board(board_doc["board"], Settings.load(), ctx.manifest.run_dir.parent.parent)
    except BoardError as exc:
        raise StageError("board_unavailable", exc.message, exc.hint) from None
    model_dir = ctx.upstream.get("model")
    prompt = format_prompt(str(ctx.settings.get("benchmark_prompt", "What is the capital of France?")),
                           model_dir, str(ctx.settings.get("prompt_template", "auto")))
    em.progress(0.1, f"running the benchmark prompt on {board.label}")

    def on_chunk(c: Chunk) -> None:
        em.log(c.text, level="debug")

    count = await load_token_counter(board, board_doc["remote_bundle"])   # each chunk's tokens, for the rate
    res = await run_query(board, board_doc["remote_bundle"], prompt, on_chunk=on_chunk,
                          max_tokens=int(ctx.settings.get("benchmark_max_tokens", 32)), count_tokens=count)
    if res.exit_status != 0 or res.kpis is None:
        raise StageError("genie_failed", f"Genie failed on {board.label}: {res.error or 'no profile written'}",
                         "See the Board page's doctor, or `hexstudio explain --file` on the log.")
    doc = chat_record(board_doc["board"], prompt, res)
    source, k = doc["source"], doc["kpis"]
    (ctx.out_dir / "chat.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False))
    em.artifact("chat.json", kind="json", role="chat")
    for name, unit in KPI_UNITS.items():
        em.metric(name, k.get(name), unit=unit, scope=source)
    em.metric("source", source)
    rate = f"{k['gen_tok_s']:.1f}" if k.get("gen_tok_s") is not None else "?"
    origin = " from the printed [KPIS] block" if k.get("origin") == "kpis_block" else ""
    em.progress(1.0, f"{k['generated_tokens']} tokens at {rate} tok/s ({source}{origin})")
    return {"source": source, "generated_tokens": k["generated_tokens"]}
