"""Runner shapes with real child processes: an older genie-t2t-run (QAIRT < 2.35: a printed [KPIS]: block,
no --profile file, no --max-tokens flag, log lines inside the reply), token counts of streamed chunks, the
token-rate series, and the simulator's flags (refused when not implemented, --action ABORT honoured)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hexstudio.core.device.board import Board, sim_board
from hexstudio.core.device.transport import LocalTransport
from hexstudio.core.genie.run import (
    Chunk,
    ChunkTokenCounter,
    QueryResult,
    budget_config_name,
    genie_argv,
    load_token_counter,
    run_query,
)
from hexstudio.core.paths import BUILTIN_MODEL_DIR, REPO_ROOT
from hexstudio.core.reports.collect import token_rate_series, token_rate_unit
from tests.genie.conftest import SimWorkspace
from tests.support.cli import python_module

OLD_T2T = Path(__file__).parent / "fake_genie" / "old_t2t.py"
TOKENIZER = BUILTIN_MODEL_DIR / "tokenizer.json"


def _old_runtime_bundle(folder: Path, **knobs: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(TOKENIZER, folder / "tokenizer.json")
    dialog = {
        "version": 1,
        "type": "basic",
        "context": {"size": 4096},
        "tokenizer": {"path": "tokenizer.json"},
        "fake-tokens": 30,
        "fake-token-ms": 15,
        **knobs,
    }
    (folder / "genie_config.json").write_text(json.dumps({"dialog": dialog}, indent=2))
    return folder


def _old_board(tmp_path: Path) -> Board:
    """A board (not simulated) whose genie-t2t-run is the old-QAIRT fake: a real child process."""
    return Board(
        "old-evk", LocalTransport(tmp_path / "home"), False, genie_command=[sys.executable, str(OLD_T2T)]
    )


def test_old_runtime_kpis_block_budget_from_the_config_and_logs_kept_out_of_the_reply(tmp_path: Path) -> None:
    side = tmp_path / "printed-kpis.json"
    bundle = _old_runtime_bundle(tmp_path / "bundle", **{"fake-kpis-file": str(side)})
    board = _old_board(tmp_path)
    prompt = 'Say [BEGIN]: ok\n[INFO]  "not a log"\nERROR: not an error'

    async def go() -> tuple[QueryResult, list[Chunk]]:
        count = await load_token_counter(board, str(bundle))
        assert count is not None
        chunks: list[Chunk] = []
        return await run_query(
            board, str(bundle), prompt, on_chunk=chunks.append, max_tokens=5, count_tokens=count
        ), chunks

    res, chunks = asyncio.run(go())
    assert res.exit_status == 0 and res.ok and res.error is None, (res.stderr, res.transcript)
    # the budget reached the real flags only, through the config (the old runtime refuses --max-tokens)
    assert res.text == "the board answers quickly and"
    assert "--max-tokens" not in genie_argv(board, "p.txt", "q.json")
    override = json.loads((bundle / budget_config_name("genie_config.json", 5)).read_text())
    assert (
        override["dialog"]["max-num-tokens"] == 5
        and override["dialog"]["tokenizer"]["path"] == "tokenizer.json"
    )
    assert "max-num-tokens" not in json.loads((bundle / "genie_config.json").read_text())["dialog"]
    # the log line printed inside the reply went to the logs
    assert {"level": "info", "message": "KV cache update"} in res.transcript.logs
    assert res.transcript.prompt == prompt and res.transcript.errors == []
    # no profile written: the KPIs come from the printed block, labeled so
    printed = json.loads(side.read_text())
    k = res.kpis
    assert k is not None and k.origin == "kpis_block" and k.source == "device" and not res.simulated
    assert k.gen_tok_s == printed["gen_rate"] and k.prompt_tok_s == printed["prompt_rate"]
    assert k.gen_time_ms == pytest.approx(printed["gen_us"] / 1000) and k.init_ms == pytest.approx(
        printed["init_us"] / 1000
    )
    assert k.generated_tokens == 5 and k.ttft_ms == pytest.approx(printed["prompt_us"] / 1000)
    # every chunk carries its token count, counted with the bundle's tokenizer: they add up to the reply's
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    assert all(isinstance(c.tokens, int) for c in chunks)
    assert sum(c.tokens or 0 for c in chunks) == len(tok.encode(res.text, add_special_tokens=False).ids)
    assert len(chunks) >= 3  # streamed word by word, not one read


def test_no_profile_and_no_kpis_block_still_fails_clearly(tmp_path: Path) -> None:
    bundle = _old_runtime_bundle(tmp_path / "bundle")
    script = tmp_path / "silent.py"
    script.write_text(
        "import sys\nprint('Using libGenie.so version 1.11.0')\nprint('[PROMPT]: x\\n\\n[BEGIN]: hi[END]')\n"
    )
    board = Board(
        "old-evk", LocalTransport(tmp_path / "home"), False, genie_command=[sys.executable, str(script)]
    )
    res = asyncio.run(run_query(board, str(bundle), "x"))
    assert res.ok and res.text == "hi" and res.kpis is None


def test_chunk_token_counts_add_up_however_the_text_is_split() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    text = (
        "The capital of France is Paris. It lies on the Seine, and about two million people live there — "
        "naïve café 日本語."
    )
    for size in (1, 2, 3, 5, 11, len(text)):
        counter = ChunkTokenCounter(count)
        counts = [counter(text[i : i + size]) for i in range(0, len(text), size)]
        assert abs(sum(counts) - count(text)) <= max(1, count(text) // 50), size
        assert all(n >= 0 for n in counts)


def test_token_rate_series_counts_tokens_when_known_and_says_chunks_otherwise() -> None:
    # 4 chunks of 3 tokens every 0.1 s: 30 tokens/s, not 10 chunks/s
    chunks = [{"t": 0.1 * i, "text": "abc", "tokens": 3} for i in range(1, 5)]
    assert token_rate_unit(chunks) == "tokens/s"
    assert [p[1] for p in token_rate_series(chunks)] == [pytest.approx(30.0)] * 3
    unknown = [{"t": c["t"], "text": c["text"]} for c in chunks]
    assert token_rate_unit(unknown) == "chunks/s"
    assert [p[1] for p in token_rate_series(unknown)] == [pytest.approx(10.0)] * 3


# -- the simulator's flags --------------------------------------------------------------------------------------


def _sim(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return python_module(
        "hexstudio.workers.genie_sim.t2t", *args, cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    )


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["-l", "adapter.bin"], "--lora"),
        (["-s", "state.bin"], "--save"),
        (["--restore", "state.bin"], "--restore"),
        (["--action", "PAUSE", "--sleep", "10"], "ABORT only"),
        (["--sleep", "10"], "give --action ABORT"),
    ],
)
def test_simulator_refuses_flags_it_does_not_implement(tmp_path: Path, flags: list[str], says: str) -> None:
    r = _sim(["-c", "genie_config.json", "-p", "hi", *flags], tmp_path)
    assert r.returncode == 1 and says in r.stderr and r.stdout == ""


def test_simulator_action_abort_after_sleep(sim_workspace: SimWorkspace, tmp_path: Path) -> None:
    bundle = Path(sim_workspace.remote_bundle)
    profile = tmp_path / "p.json"
    r = _sim(
        [
            "-c",
            "genie_config.json",
            "-p",
            "Question: Where does the sun rise? Answer:",
            "--max-tokens",
            "400",
            "--action",
            "abort",
            "--sleep",
            "0",
            "--profile",
            str(profile),
        ],
        bundle,
    )
    assert r.returncode == 0, r.stderr
    assert "[ABORT]: " in r.stdout and "Query successfully aborted" in r.stdout and "[END]" not in r.stdout
    from hexstudio.core.genie.profile import parse_profile
    from hexstudio.core.genie.transcript import parse_transcript

    t = parse_transcript(r.stdout, 0, "Question: Where does the sun rise? Answer:")
    k = parse_profile(profile)
    assert t.state == "aborted" and k.source == "simulated" and (k.generated_tokens or 0) < 400
    full = _sim(
        ["-c", "genie_config.json", "-p", "Question: Where does the sun rise? Answer:", "--max-tokens", "3"],
        bundle,
    )
    assert full.returncode == 0 and parse_transcript(full.stdout).state == "complete"


def test_simulator_session_chunks_carry_their_token_counts(sim_workspace: SimWorkspace) -> None:
    from hexstudio.core.genie.conversation import Conversation
    from hexstudio.core.genie.session import ChatSession, TurnResult

    async def go() -> TurnResult:
        async with ChatSession(
            sim_board(sim_workspace.root),
            sim_workspace.remote_bundle,
            Conversation(template="qa"),
            max_tokens=12,
        ) as s:
            return await s.send("What is the sun?")

    r = asyncio.run(go())
    assert r.state == "complete" and r.kpis is not None and r.chunks
    assert all(isinstance(c.tokens, int) and c.tokens >= 1 for c in r.chunks)
    assert sum(c.tokens or 0 for c in r.chunks) == r.kpis.generated_tokens
