"""Run one Genie query on a board and stream its reply.

The prompt goes to the board as a FILE (--prompt_file): user text never enters a command line.
Each run gets a fresh --profile name (genie-t2t-run refuses an existing one). Text is streamed
as it arrives, each chunk with its arrival time.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import logging
import posixpath
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from hexstudio.core.device.board import Board, on_this_machine, python_env
from hexstudio.core.device.transport import RemoteProcess
from hexstudio.core.genie.profile import Kpis, ProfileError, kpis_from_block, parse_profile
from hexstudio.core.genie.transcript import Transcript, TranscriptParser
from hexstudio.shared.errors import ActionableError

log = logging.getLogger("hexstudio.genie.run")


@dataclass
class Chunk:
    t: float  # seconds since the query started
    text: str
    mono: float | None = None  # the producer's time.monotonic() when it emitted the text (session helpers)
    tokens: int | None = (
        None  # tokens in this chunk: from the runner (one dialog callback a token) or counted
    )
    # with the bundle's tokenizer; None when neither is known (then it is one chunk)


class ChunkTokenCounter:
    """Tokens in each streamed chunk of genie-t2t-run's stdout, with the bundle's tokenizer. stdout reads
    split text anywhere (half a word: "Par" + "is" is 2 tokens then 1), so the running count of the reply
    so far is kept (each chunk adds tokens(tail + chunk) - tokens(tail), with a short tail of context; O(1)
    a chunk) and a chunk gets what that running count grew beyond what was already handed out. Summed
    over a reply this is the tokenizer's count of the reply."""

    TAIL = 48  # characters of context: a token never spans more

    def __init__(self, count: Callable[[str], int]) -> None:
        self.count = count
        self.tail = ""
        self.total = 0  # running token count of the text so far
        self.given = 0  # tokens handed out to chunks so far

    def __call__(self, text: str) -> int:
        before = self.count(self.tail) if self.tail else 0
        self.total += self.count(self.tail + text) - before
        self.tail = (self.tail + text)[-self.TAIL :]
        n = max(0, self.total - self.given)
        self.given += n
        return n


async def load_token_counter(
    board: Board, bundle_dir: str, config: str = "genie_config.json"
) -> Callable[[str], int] | None:
    """Token counts with the bundle's own tokenizer.json (the `tokenizers` package: Rust, no torch), read
    from the board; None when the config names none or it cannot be read."""
    try:
        cfg = json.loads(
            (await board.transport.read_bytes(posixpath.join(bundle_dir, config))).decode("utf-8")
        )
        rel = ((cfg.get("dialog") or {}).get("tokenizer") or {}).get("path")
        if not rel:
            return None
        from tokenizers import Tokenizer

        raw = await board.transport.read_bytes(posixpath.join(bundle_dir, rel))
        tok = await asyncio.to_thread(Tokenizer.from_str, raw.decode("utf-8"))
    except Exception:
        return None
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


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
    # Genie's profile as the runner wrote it (its file on the board is removed with the prompt's)
    profile: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.exit_status == 0 and self.transcript.state == "complete"


async def ensure_dir(board: Board, path: str) -> None:
    """SFTP writes need the folder to exist on the board (the local transport makes it itself)."""
    if not await board.transport.exists(path):
        res = await board.transport.run(["mkdir", "-p", "--", path], timeout=30)
        if res.exit_status != 0:
            raise OSError(f"cannot create {path} on {board.label}: {res.stderr.strip()}")


def genie_argv(
    board: Board, prompt_file: str, profile_file: str, config: str = "genie_config.json"
) -> list[str]:
    """genie-t2t-run's flags only (facts/genie.md): the reply budget travels in the config, not as a flag."""
    argv = [*board.genie_command, "-c", config, "--prompt_file", prompt_file, "--profile", profile_file]
    if board.env_script:  # source the QAIRT environment; arguments stay argv, never interpolated
        argv = ["bash", "-c", 'source "$1"; shift; exec "$@"', "_", board.env_script, *argv]
    return argv


def budget_config_name(config: str, max_tokens: int) -> str:
    stem = posixpath.basename(config).removesuffix(".json")
    return posixpath.join(posixpath.dirname(config), f".hexstudio-{stem}-max{int(max_tokens)}.json")


CONFIG_COPIES = ("genie_config.hexstudio-*.json", ".hexstudio-genie_config*-max*.json")
CONFIG_COPIES_KEPT_DAYS = 7
_PRUNED: set[tuple[str, str]] = set()  # (board, bundle folder): once per process


async def remove_old_configs(board: Board, bundle_dir: str) -> None:
    """The copies of a bundle's config that the studio writes beside it (a chat's own sampler; each reply budget
    of genie-t2t-run) are rewritten whenever they are used, so their age says when that was: those no one wrote
    for a week are removed, once per process and bundle (nothing else ever removed them). Best effort."""
    key = (board.label, bundle_dir)
    if key in _PRUNED:
        return
    _PRUNED.add(key)
    names: list[str] = []
    for pattern in CONFIG_COPIES:
        names += ["-o", "-name", pattern] if names else ["-name", pattern]
    # -H: a bundle folder that is a link is followed; -mtime +N is "more than N whole days ago"
    argv = ["find", "-H", bundle_dir, "-maxdepth", "1", "-type", "f", "(", *names, ")"]
    argv += ["-mtime", f"+{CONFIG_COPIES_KEPT_DAYS - 1}", "-delete"]
    await remove_quietly(board, argv, "old config copies")


async def remove_quietly(board: Board, argv: list[str], what: str) -> None:
    """A clean-up command on the board: its failure is logged (`what` were not removed), never raised."""
    try:
        res = await board.transport.run(argv, timeout=30)
    except (OSError, asyncio.TimeoutError) as exc:
        log.info("%s on %s were not removed: %s", what, board.label, exc)
        return
    if res.exit_status != 0:
        log.info("%s on %s were not removed: %s", what, board.label, res.stderr.strip())


async def budget_config(board: Board, bundle_dir: str, config: str, max_tokens: int) -> str:
    """genie-t2t-run has no reply-budget flag: the budget goes into a copy of the dialog config
    (`dialog.max-num-tokens`), next to the original so relative paths (tokenizer, ctx-bins) still resolve.
    Named by budget, so repeated runs rewrite one small file. Returns its path (relative like `config`);
    `config` itself when it cannot be read: then genie-t2t-run fails on it and says why (decoded as usual)."""
    src = posixpath.join(bundle_dir, config)
    try:
        cfg = json.loads((await board.transport.read_bytes(src)).decode("utf-8"))
        dialog = cfg["dialog"]
        if not isinstance(dialog, dict):
            return config
    except (OSError, ValueError, KeyError, TypeError):
        return config
    dialog["max-num-tokens"] = int(max_tokens)
    name = budget_config_name(config, max_tokens)
    await board.transport.write_bytes(
        posixpath.join(bundle_dir, name), json.dumps(cfg, indent=2).encode("utf-8")
    )
    await remove_old_configs(board, bundle_dir)
    return name


async def run_query(
    board: Board,
    bundle_dir: str,
    prompt: str,
    *,
    on_chunk: Callable[[Chunk], None] | None = None,
    stop: asyncio.Event | None = None,
    max_tokens: int | None = None,
    config: str = "genie_config.json",
    count_tokens: Callable[[str], int] | None = None,
) -> QueryResult:
    """`count_tokens(text)`: the bundle's tokenizer (load_token_counter), so each Chunk carries its token
    count; without it chunks carry tokens=None."""
    t = board.transport
    rid = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    work = posixpath.join(bundle_dir, ".hexstudio-runs")
    prompt_file = posixpath.join(work, f"prompt-{rid}.txt")
    profile_file = posixpath.join(work, f"profile-{rid}.json")
    await ensure_dir(board, work)
    proc: RemoteProcess | None = None
    finished = False
    pending: list[asyncio.Future[Any]] = []  # cancelled in the finally when the turn ends early
    try:
        await t.write_bytes(prompt_file, prompt.encode("utf-8"))
        if max_tokens:
            config = await budget_config(board, bundle_dir, config, int(max_tokens))
        t0 = time.monotonic()
        proc = await t.start(
            genie_argv(board, prompt_file, profile_file, config),
            cwd=bundle_dir,
            # this machine's simulator finds its modules by PYTHONPATH; a remote host's environment is its own
            env=python_env() if board.simulated and on_this_machine(board) else None,
        )
        parser = TranscriptParser(prompt)  # its echo is skipped exactly, whatever it holds
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        chunks: list[Chunk] = []
        err_parts: list[bytes] = []
        counter = ChunkTokenCounter(count_tokens) if count_tokens is not None else None

        async def read_err() -> None:
            while data := await proc.read_stderr():
                err_parts.append(data)

        async def read_out() -> None:
            while data := await proc.read_stdout():
                text = parser.feed(dec.decode(data))
                if text:
                    c = Chunk(
                        time.monotonic() - t0, text, tokens=counter(text) if counter is not None else None
                    )
                    chunks.append(c)
                    if on_chunk is not None:
                        on_chunk(c)

        readers: asyncio.Future[Any] = asyncio.gather(read_out(), read_err())
        pending.append(readers)
        stopped = False
        if stop is not None:
            stop_wait: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
            pending.append(stop_wait)
            done, _ = await asyncio.wait({readers, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if stop_wait in done and not readers.done():
                stopped = True
                await proc.terminate()
            stop_wait.cancel()
        await readers
        rc = await proc.wait()
        finished = True
        tr = parser.finish(rc)
        if stopped:
            tr.state = "aborted"
        kpis = None
        error = None
        profile = None
        if await t.exists(profile_file):
            raw = (await t.read_bytes(profile_file)).decode("utf-8")
            try:
                kpis = parse_profile(raw)
                profile = json.loads(raw)
            except ProfileError as exc:
                error = str(exc)
    finally:
        for f in pending:
            f.cancel()
        if proc is not None and not finished:
            # the turn ended by an error or a cancel while genie-t2t-run still ran: it is not left running
            with contextlib.suppress(OSError, ActionableError):
                await proc.terminate()
        # the user's prompt (per turn: the whole conversation) and the profile do not stay on a shared board,
        # whatever ended the turn (a link lost now is the next turn's to report: this reply is complete)
        with contextlib.suppress(OSError, ActionableError):
            await t.run(["rm", "-f", "--", prompt_file, profile_file], timeout=30)
    if kpis is None and error is None:
        kpis = kpis_from_block(tr.kpis_block, tr.simulated)  # an older QAIRT prints [KPIS]: instead
    stderr = b"".join(err_parts).decode("utf-8", "replace")
    if rc != 0 and not stopped:
        error = explain_failure(tr, stderr, rc)
    # simulated or device: what the runner itself says (its banner, its profile's metadata), whatever the
    # board record claims, so simulator numbers are never labeled device results
    simulated = runner_simulated(board, tr, kpis)
    if kpis is not None and simulated:
        kpis = replace(kpis, source="simulated")
    return QueryResult(
        tr.text,
        chunks,
        tr,
        kpis,
        rc,
        simulated,
        (time.monotonic() - t0) * 1000,
        error=error,
        stderr=stderr[-4000:],
        profile=profile,
    )


def runner_simulated(board: Board, tr: Transcript | None = None, kpis: Kpis | None = None) -> bool:
    """True when the board is the simulator or the runner reported itself as one."""
    return bool(
        board.simulated
        or (tr is not None and tr.simulated)
        or (kpis is not None and kpis.source == "simulated")
    )


def explain_failure(tr: Transcript, stderr: str, exit_status: int | None = None) -> str:
    """The failure in a person's words: the last error line, plus cause and fix from the error decoder."""
    text = "\n".join([*tr.errors, stderr])
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines:
        last = lines[-1].strip()
    elif exit_status is not None and exit_status > 128:
        last = (
            f"genie-t2t-run died from signal {exit_status - 128} (exit status {exit_status}) "
            f"{'mid-reply' if tr.state in ('crashed', 'streaming') and tr.text else 'before replying'}"
        )
    elif exit_status:
        last = f"genie-t2t-run exited with status {exit_status} without an error message"
    else:
        last = "genie-t2t-run stopped without an error message"
    try:
        from hexstudio.core.device.explain import summary

        found = summary(text)
        if found:
            return f"{last} — {found}"
    except ImportError:
        pass
    return last
