"""Run one Genie query on a board and stream its reply.

The prompt goes to the board as a FILE (--prompt_file): user text never enters a command line.
Each run gets a fresh --profile name (genie-t2t-run refuses an existing one). Text is streamed
as it arrives, each chunk with its arrival time.
"""

from __future__ import annotations

import asyncio
import codecs
import posixpath
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.core.device.board import Board, python_env
from app.core.genie.profile import Kpis, ProfileError, parse_profile
from app.core.genie.transcript import Transcript, TranscriptParser


@dataclass
class Chunk:
    t: float          # seconds since the query started
    text: str
    mono: float | None = None   # the producer's time.monotonic() when it emitted the text (session helpers)


@dataclass
class QueryResult:
    text: str
    chunks: list[Chunk]
    transcript: Transcript
    kpis: Kpis | None
    exit_status: int
    simulated: bool
    wall_ms: float
    error: str | None = None
    stderr: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_status == 0 and self.transcript.state == "complete"


async def ensure_dir(board: Board, path: str) -> None:
    """SFTP writes need the folder to exist on the board (the local transport makes it itself)."""
    if not await board.transport.exists(path):
        res = await board.transport.run(["mkdir", "-p", "--", path], timeout=30)
        if res.exit_status != 0:
            raise OSError(f"cannot create {path} on {board.label}: {res.stderr.strip()}")


def genie_argv(board: Board, prompt_file: str, profile_file: str, max_tokens: int | None = None,
               config: str = "genie_config.json") -> list[str]:
    argv = [*board.genie_command, "-c", config, "--prompt_file", prompt_file, "--profile", profile_file]
    if max_tokens and board.simulated:
        argv += ["--max-tokens", str(int(max_tokens))]
    if board.env_script:  # source the QAIRT environment; arguments stay argv, never interpolated
        argv = ["bash", "-c", 'source "$1"; shift; exec "$@"', "_", board.env_script, *argv]
    return argv


async def run_query(board: Board, bundle_dir: str, prompt: str, *,
                    on_chunk: Callable[[Chunk], None] | None = None,
                    stop: asyncio.Event | None = None, max_tokens: int | None = None,
                    config: str = "genie_config.json") -> QueryResult:
    t = board.transport
    rid = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    work = posixpath.join(bundle_dir, ".hexstudio-runs")
    prompt_file = posixpath.join(work, f"prompt-{rid}.txt")
    profile_file = posixpath.join(work, f"profile-{rid}.json")
    await ensure_dir(board, work)
    await t.write_bytes(prompt_file, prompt.encode("utf-8"))
    t0 = time.monotonic()
    proc = await t.start(genie_argv(board, prompt_file, profile_file, max_tokens, config), cwd=bundle_dir,
                         env=python_env() if board.simulated else None)
    parser = TranscriptParser(prompt)   # its echo is skipped exactly, whatever it holds
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    chunks: list[Chunk] = []
    err_parts: list[bytes] = []

    async def read_err() -> None:
        while data := await proc.read_stderr():
            err_parts.append(data)

    async def read_out() -> None:
        while data := await proc.read_stdout():
            text = parser.feed(dec.decode(data))
            if text:
                c = Chunk(time.monotonic() - t0, text)
                chunks.append(c)
                if on_chunk is not None:
                    on_chunk(c)

    readers: asyncio.Future[Any] = asyncio.gather(read_out(), read_err())
    stopped = False
    if stop is not None:
        stop_wait: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({readers, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if stop_wait in done and not readers.done():
            stopped = True
            await proc.terminate()
        stop_wait.cancel()
    await readers
    rc = await proc.wait()
    tr = parser.finish(rc)
    if stopped:
        tr.state = "aborted"
    kpis = None
    error = None
    if await t.exists(profile_file):
        try:
            kpis = parse_profile((await t.read_bytes(profile_file)).decode("utf-8"))
        except ProfileError as exc:
            error = str(exc)
    stderr = b"".join(err_parts).decode("utf-8", "replace")
    if rc != 0 and not stopped:
        error = explain_failure(tr, stderr, rc)
    return QueryResult(tr.text, chunks, tr, kpis, rc, board.simulated, (time.monotonic() - t0) * 1000,
                       error=error, stderr=stderr[-4000:])


def explain_failure(tr: Transcript, stderr: str, exit_status: int | None = None) -> str:
    """The failure in a person's words: the last error line, plus cause and fix from the error decoder."""
    text = "\n".join([*tr.errors, stderr])
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines:
        last = lines[-1].strip()
    elif exit_status is not None and exit_status > 128:
        last = (f"genie-t2t-run died from signal {exit_status - 128} (exit status {exit_status}) "
                f"{'mid-reply' if tr.state in ('crashed', 'streaming') and tr.text else 'before replying'}")
    elif exit_status:
        last = f"genie-t2t-run exited with status {exit_status} without an error message"
    else:
        last = "genie-t2t-run stopped without an error message"
    try:
        from app.core.device.explain import summary

        found = summary(text)
        if found:
            return f"{last} — {found}"
    except ImportError:
        pass
    return last
