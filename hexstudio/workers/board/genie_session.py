#!/usr/bin/env python3
"""HexStudio's chat helper for the board: keeps one GenieDialog open through libGenie's C API
(ctypes) so the model stays loaded between chat turns, and speaks JSON lines on stdin/stdout.

Standard library only (it is copied to the board as <home>/hexstudio/bin/<digest>/genie_session.py, its companion
modules helper_io.py and genie_paths.py beside it, and run from the bundle folder after sourcing the QAIRT
environment):

    python3 genie_session.py --config genie_config.json [--lib libGenie.so] [--sampler JSON]
                             [--engine JSON] [--log-level error|warn|info|verbose]

--engine merges a JSON object into dialog.engine before the dialog is created (the simulator board's
x86 settings: n-threads 1, poll false; the bundle's file is not changed). --log-level binds a GenieLog
logger (GenieLog_create + GenieDialogConfig_bindLogger) and forwards Genie's own lines as log events.

stdin, one JSON object a line:
    {"op": "query", "id": N, "prompt": TEXT, "max_tokens": N|null, "stop": [TEXT, ...]|absent}
                           (stop: GenieDialog_setStopSequence({"stop-sequence": [...]}) before the query;
                            Dialog.cpp's format, an empty list clears them; they stay set for later queries;
                            Genie ends the reply at one and does not emit the matched text)
    {"op": "abort"}        (during a query: GenieDialog_signal(ABORT))
    {"op": "reset"}        (GenieDialog_reset: clears the KV cache)
    {"op": "sampler", "sampler": {...}}  (GenieSampler_applyConfig: seed/temp/top-k/top-p for later queries)
    {"op": "quit"}         (or EOF: GenieDialog_free, exit 0)
stdout, one JSON object a line:
    {"event": "ready", "genie_version", "init_ms", "context_length", "profile": bool, "pid",
     "stop_sequences": bool}                    (whether this libGenie has GenieDialog_setStopSequence)
    {"event": "stop", "id", "applied": bool, "message"}   (a query's "stop", before its text: applied, or why
                                                not: the host then cuts the reply at them itself)
    {"event": "text", "id", "text", "tokens", "mono"}  as the dialog's callback delivers it: one
                                                callback a token (tokens: 1; absent when a whole reply
                                                came in one callback; mono: the helper's
                                                time.monotonic() when it was emitted)
    {"event": "end", "id", "state": "complete"|"aborted"|"context_full"|"failed", "status", "profile": {...}|null,
     "overran": N (only when the dialog made N tokens past max_tokens: they were not sent, and the dialog's
                   KV cache holds them: the host resets it; a dialog that does not stop on ABORT within
                   OVERRUN_GRACE_S gets this end event from the helper, which then exits), "measured": {...}}
    {"event": "reset", "status"}
    {"event": "error", "code", "message"}       (then exit, when it happens before "ready")
    {"event": "log", "level", "message"}         Genie's own log lines (with --log-level)
The user's text only ever travels inside these JSON strings: never on a command line.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import ctypes
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator

# Run as a package module (python -m hexstudio.workers.board.genie_session, the simulator board) it imports its
# companions by their package path; copied to the board, they lie beside it in <home>/hexstudio/bin/<digest>/ (this
# script's folder, sys.path[0]) and are imported by their bare names.
try:
    from hexstudio.shared.genie_paths import SAFE_PART, genie_config_paths, not_regular_kind
    from hexstudio.workers.board.helper_io import bad_request, emit, read_commands
except ImportError:
    from genie_paths import SAFE_PART, genie_config_paths, not_regular_kind  # type: ignore[no-redef]
    from helper_io import bad_request, emit, read_commands  # type: ignore[no-redef]

SUCCESS = 0
WARNING_ABORTED, WARNING_PAUSED, WARNING_CONTEXT_EXCEEDED = 1, 3, 4  # Genie_Status_t warnings (> 0)
SENTENCE_COMPLETE, SENTENCE_BEGIN, SENTENCE_CONTINUE, SENTENCE_END, SENTENCE_ABORT = 0, 1, 2, 3, 4
ACTION_ABORT = 1

# how long a dialog that went past max_tokens gets to honour ABORT before the helper exits to stop it
OVERRUN_GRACE_S = float(os.environ.get("HEXSTUDIO_OVERRUN_GRACE_S") or 5.0)


def fail(code: str, message: str, rc: int = 2) -> int:
    emit({"event": "error", "code": code, "message": message})
    return rc


QUERY_CB = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p)
# GenieLog_Callback_t(handle, fmt, level, timestamp, va_list): va_list reaches C code as a pointer on x86_64
# and aarch64 alike (an array type on one, a large struct passed by reference on the other)
LOG_CB = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p
)
LOG_LEVELS = {"error": 1, "warn": 2, "info": 3, "verbose": 4}
LOG_NAMES = {v: k for k, v in LOG_LEVELS.items()}
ALLOC_CB = ctypes.CFUNCTYPE(None, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))


# The path rules of hexstudio/shared/bundle/safepath.py on the board (their shared part: genie_paths). A bundle
# pushed by an older studio, or edited on the board, is refused here too.
def unsafe_reason(path: object, root: str) -> str | None:
    """Why `path` (from genie_config.json) may not be used under the bundle folder `root`; None when fine."""
    if not isinstance(path, str) or not path:
        return "it is not a non-empty text path"
    if "\x00" in path or "\\" in path or re.match(r"^[A-Za-z]:", path):
        return "it holds a NUL, a backslash or a drive letter"
    if path.startswith(("/", "~")):
        return "it is absolute; it must be relative to the bundle folder"
    for part in path.split("/"):
        if part in ("", ".", ".."):
            return "it has an empty, '.' or '..' part"
        if part.startswith("-") or not SAFE_PART.match(part) or len(part) > 255:
            return f"the part {part!r} is outside the safe set (letters, digits, '.', '_', '-', '+')"
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, path))
    if target != base and not target.startswith(base + os.sep):
        return f"it leads outside the bundle folder through a symbolic link (to {target})"
    return not_regular(target)


def not_regular(target: str) -> str | None:
    """Why `target` may not be opened as a file (a FIFO would hang the load, a device read forever); None when
    it is a regular file or absent (Genie then says it is missing)."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"it cannot be examined ({exc})"
    kind = not_regular_kind(mode)
    return None if kind is None else f"it is {kind}, not a regular file"


def check_config_paths(cfg: dict, root: str) -> str | None:
    for entry, path in genie_config_paths(cfg):
        why = unsafe_reason(path, root)
        if why is not None:
            return (
                f"genie_config.json {entry}: refused path {path!r}: {why}. Nothing was loaded. Push a bundle "
                "compiled by HexStudio again (the studio refuses such bundles before sending them)."
            )
    return None


def bind(lib: ctypes.CDLL) -> dict:
    """Declare the functions we use; optional ones (profile, signal) may be absent in old libraries."""
    vp, pvp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
    sig = {
        "GenieDialogConfig_createFromJson": ([ctypes.c_char_p, pvp], True),
        "GenieDialog_create": ([vp, pvp], True),
        "GenieDialog_query": ([vp, ctypes.c_char_p, ctypes.c_int, QUERY_CB, vp], True),
        "GenieDialog_reset": ([vp], False),
        "GenieDialog_free": ([vp], True),
        "GenieDialogConfig_free": ([vp], False),
        "GenieDialog_signal": ([vp, ctypes.c_int], False),
        "GenieDialog_setMaxNumTokens": ([vp, ctypes.c_uint32], False),
        "GenieProfile_create": ([vp, pvp], False),
        "GenieDialogConfig_bindProfiler": ([vp, vp], False),
        "GenieProfile_getJsonData": ([vp, ALLOC_CB, pvp], False),
        "GenieProfile_free": ([vp], False),
        "GenieDialog_getSampler": ([vp, pvp], False),
        "GenieSamplerConfig_createFromJson": ([ctypes.c_char_p, pvp], False),
        "GenieSampler_applyConfig": ([vp, vp], False),
        "GenieSamplerConfig_free": ([vp], False),
        "GenieLog_create": ([vp, LOG_CB, ctypes.c_int, pvp], False),
        "GenieLog_free": ([vp], False),
        "GenieDialogConfig_bindLogger": ([vp, vp], False),
        "GenieDialog_setStopSequence": ([vp, ctypes.c_char_p], False),
        "Genie_getApiMajorVersion": ([], False),
        "Genie_getApiMinorVersion": ([], False),
        "Genie_getApiPatchVersion": ([], False),
    }
    fns = {}
    for name, (argtypes, required) in sig.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            if required:
                raise
            continue
        f.argtypes = argtypes
        f.restype = ctypes.c_uint32 if name.startswith("Genie_get") else ctypes.c_int32
        fns[name] = f
    return fns


def genie_logger(fns: dict, level: str, sink: object) -> tuple:
    """(log handle, callback keep-alive) for GenieLog_create; `sink(level_name, text)` gets each formatted line.
    (None, None) when this libGenie has no logging API."""
    if "GenieLog_create" not in fns:
        return None, None
    libc = ctypes.CDLL(None)
    vsnprintf = libc.vsnprintf
    vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
    vsnprintf.restype = ctypes.c_int

    def on_log(_handle: object, fmt: bytes | None, lvl: int, _ts: int, args: object) -> None:
        buf = ctypes.create_string_buffer(4096)
        try:
            vsnprintf(buf, len(buf), fmt or b"", args)
            text = buf.value.decode("utf-8", "replace").rstrip()
        except Exception:  # never let a log line break the dialog
            text = (fmt or b"").decode("utf-8", "replace").rstrip()
        if text:
            sink(LOG_NAMES.get(int(lvl), str(lvl)), text)  # type: ignore[operator]

    cb = LOG_CB(on_log)
    handle = ctypes.c_void_p()
    if fns["GenieLog_create"](None, cb, LOG_LEVELS.get(level, 3), ctypes.byref(handle)) != SUCCESS:
        return None, None
    return handle, cb


def greedy(sampler: dict) -> bool:
    """Whether Genie decodes greedily with these sampler values (qualla sampler.cpp: temp <= 0 or top-k 1;
    its defaults temp 0.8, top-k 40 where a key is left out)."""
    try:
        return float(sampler.get("temp", 0.8)) <= 0 or int(sampler.get("top-k", 40)) == 1
    except (TypeError, ValueError):
        return False


def latest_events(doc: object) -> object:
    """A Genie profile with each component's latest event of each type only. The bound profile keeps every
    query's stats until it is freed (Profile.cpp: Profiler::addProfileStat, cleared only by freeStats), and
    GenieProfile_getJsonData writes them all: sent whole, each end event of a long serve session grew by a query.
    The host reads the latest create and query (hexstudio.core.genie.profile.parse_profile)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("components"), list):
        return doc
    for component in doc["components"]:
        events = component.get("events") if isinstance(component, dict) else None
        if isinstance(events, list):
            last = {str(ev.get("type")) if isinstance(ev, dict) else "": n for n, ev in enumerate(events)}
            keep = set(last.values())
            component["events"] = [ev for n, ev in enumerate(events) if n in keep]
    return doc


@contextlib.contextmanager
def captured_fds(forward: bool = False) -> Iterator[list[str]]:
    """Capture what C code writes to fds 1 and 2 while the block runs (Genie prints its refusals there; fd 1 is
    also this helper's event channel, which such text would break), through a pipe a thread reads; `forward`: also
    on to this process's stderr as it comes (what the studio shows when a helper ends without a word; text a
    library prints an instant before it aborts may still be lost). Where no pipe can be made, nothing is captured
    and nothing redirected."""
    out: list[str] = []
    opened: list[int] = []
    try:
        r, w = os.pipe()
        opened += [r, w]
        libc = ctypes.CDLL(None)
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1)]
        opened.append(saved[0])
        saved.append(os.dup(2))
    except OSError:  # no descriptors left, or fd 1/2 closed: nothing redirected, what was opened closed
        for fd in opened:
            os.close(fd)
        yield out
        return
    chunks: list[bytes] = []

    def pump() -> None:
        while True:
            try:
                b = os.read(r, 65536)
            except OSError:
                return
            if not b:
                return
            chunks.append(b)
            if forward:
                with contextlib.suppress(OSError):
                    os.write(saved[1], b)

    reader = threading.Thread(target=pump, name="captured-fds", daemon=True)
    reader.start()
    try:
        os.dup2(w, 1)
        os.dup2(w, 2)
        os.close(w)
        yield out
    finally:
        libc.fflush(None)
        os.dup2(saved[0], 1)  # the pipe's last writers go: the reader reads to its end
        os.dup2(saved[1], 2)
        reader.join(10)
        os.close(saved[0])
        if not reader.is_alive():  # one still reading (a writer of the pipe lives on) keeps its fds: no reuse
            os.close(r)
            os.close(saved[1])
        out.append(b"".join(chunks).decode("utf-8", "replace"))


class ConfigRefused(RuntimeError):
    """Genie's parser refused genie_config.json (not a model that failed to load): its own words included."""


class Helper:
    def __init__(self, fns: dict, config_json: str, log_level: str | None = None) -> None:
        self.f = fns
        self.cfg = ctypes.c_void_p()
        self.dialog = ctypes.c_void_p()
        self.profile = ctypes.c_void_p()
        self.log = None
        self._log_cb = None
        self.in_query = threading.Event()
        self._keep: list[ctypes.Array[ctypes.c_char]] = []
        try:
            dialog_doc = json.loads(config_json).get("dialog") or {}
            self.dialog_type = str(dialog_doc.get("type") or "basic")
            self.created_sampler = dict(dialog_doc.get("sampler") or {})
            limit = dialog_doc.get("max-num-tokens")
        except (ValueError, AttributeError, TypeError):
            self.dialog_type, self.created_sampler, limit = "basic", {}, None
        # the config's reply limit (Genie's default: none): what a query without max_tokens runs under again
        self.config_max_tokens = limit if isinstance(limit, int) and limit > 0 else 0xFFFFFFFF
        self.sampler_values: dict | None = None  # the last applied (re-applied to a recreated dialog)
        self.stop_values: list | None = None  # the last applied stop sequences (re-applied likewise)
        self.limited = False  # a query's max_tokens is on the dialog (not the config's own limit)
        self.remake = False  # the dialog must be made again before its next use (a full context)
        self.used = False  # a query (or its stop sequences) since the dialog was made
        # Genie says why it refuses a config on fd 1/2, before any logger can be bound to the config
        with captured_fds(forward=True) as said:
            st = self.f["GenieDialogConfig_createFromJson"](
                config_json.encode("utf-8"), ctypes.byref(self.cfg)
            )
        text = " ".join("".join(said).split())[-600:]
        if st != SUCCESS:
            raise ConfigRefused(
                f"GenieDialogConfig_createFromJson failed (status {st}): the config is invalid"
                + (f". Genie said: {text}" if text else "")
            )
        if text:  # what Genie printed on the way (a warning): in the log, not on the event channel
            emit({"event": "log", "level": "warn", "message": text})
        if log_level and "GenieDialogConfig_bindLogger" in self.f:
            self.log, self._log_cb = genie_logger(
                self.f, log_level, lambda lvl, text: emit({"event": "log", "level": lvl, "message": text})
            )
            if self.log is not None:
                self.f["GenieDialogConfig_bindLogger"](self.cfg, self.log)
        can_profile = "GenieProfile_create" in self.f and "GenieDialogConfig_bindProfiler" in self.f
        if can_profile and (
            self.f["GenieProfile_create"](None, ctypes.byref(self.profile)) != SUCCESS
            or self.f["GenieDialogConfig_bindProfiler"](self.cfg, self.profile) != SUCCESS
        ):
            self.profile = ctypes.c_void_p()
        t0 = time.perf_counter()
        st = self.f["GenieDialog_create"](self.cfg, ctypes.byref(self.dialog))
        self.init_ms = (time.perf_counter() - t0) * 1000
        if st != SUCCESS:
            raise RuntimeError(f"GenieDialog_create failed (status {st}): Failed to create the dialog.")

    def version(self) -> str:
        try:
            return ".".join(str(self.f[f"Genie_getApi{p}Version"]()) for p in ("Major", "Minor", "Patch"))
        except KeyError:
            return "unknown"

    def profile_json(self) -> object:
        """The bound profile's JSON (GenieProfile_getJsonData), only its latest event of each type."""
        if not self.profile or "GenieProfile_getJsonData" not in self.f:
            return None

        def alloc(size: int, out: object) -> None:  # Genie_AllocCallback_t: we own the buffer
            buf = ctypes.create_string_buffer(int(size) + 1)
            self._keep.append(buf)
            out[0] = ctypes.addressof(buf)  # type: ignore[index]

        cb = ALLOC_CB(alloc)
        data = ctypes.c_void_p()
        st = self.f["GenieProfile_getJsonData"](self.profile, cb, ctypes.byref(data))
        raw = ctypes.string_at(data.value) if data.value else b""
        self._keep.clear()
        if st != SUCCESS or not raw:
            return None
        try:
            return latest_events(json.loads(raw.decode("utf-8", "replace")))
        except ValueError:
            return None

    def set_stop(self, stop: object) -> str | None:
        """GenieDialog_setStopSequence with Dialog.cpp's JSON ({"stop-sequence": [...]}); None when applied."""
        if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop):
            return "stop must be a list of strings"
        if "GenieDialog_setStopSequence" not in self.f:
            return "this libGenie has no GenieDialog_setStopSequence"
        st = self.f["GenieDialog_setStopSequence"](
            self.dialog, json.dumps({"stop-sequence": stop}).encode("utf-8")
        )
        if st == SUCCESS:
            self.stop_values = list(stop)
        return None if st == SUCCESS else f"GenieDialog_setStopSequence failed (status {st})"

    def query(self, qid: object, prompt: str, max_tokens: object) -> None:
        budget = int(max_tokens) if isinstance(max_tokens, int) and max_tokens > 0 else 0
        if "GenieDialog_setMaxNumTokens" in self.f and (budget or self.limited):
            # the limit stays on the dialog: a query without one runs under the config's again, not the last one's
            self.f["GenieDialog_setMaxNumTokens"](self.dialog, budget or self.config_max_tokens)
            self.limited = bool(budget)
        self.aborting = False  # an abort that came as the last query ended is no abort of this one
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        t0 = time.perf_counter()
        m = {
            "first": 0.0,
            "last": 0.0,
            "callbacks": 0,
            "aborted": False,
            "held": 0,
            "whole": False,
            "tokens": 0,
            "signalled": False,
        }
        over = {"tokens": 0, "seen": 0}

        def on_token(resp: bytes | None, code: int, _user: object) -> None:
            if code == SENTENCE_ABORT:
                m["aborted"] = True
            early = not m["callbacks"] and not m["aborted"] and code != SENTENCE_ABORT
            if self.aborting and early and not m["signalled"] and "GenieDialog_signal" in self.f:
                # Genie drops an ABORT that comes before its query counts as active (Dialog::signalAction): an abort
                # asked for before the first token is signalled again here, where the query is certainly active
                # (a later one reached an active query: signalled once)
                m["signalled"] = True
                self.f["GenieDialog_signal"](self.dialog, ACTION_ABORT)
            if budget and code in (SENTENCE_BEGIN, SENTENCE_CONTINUE):
                over["seen"] += 1
                if over["seen"] > budget:
                    # Genie 1.21's lade dialog ignores the token limit (docs/genie.md): past it, nothing reaches
                    # the host, and the dialog is asked to stop (a build that honours ABORT then does)
                    if not over["tokens"]:
                        if "GenieDialog_signal" in self.f:
                            self.f["GenieDialog_signal"](self.dialog, ACTION_ABORT)
                        threading.Thread(target=overrun_watch, daemon=True).start()
                    over["tokens"] += 1
                    return
            if over["tokens"] and code == SENTENCE_ABORT:
                return
            if code in (SENTENCE_BEGIN, SENTENCE_CONTINUE):
                # one callback, one token (its text may be held: half a character)
                m["held"] = int(m["held"]) + 1
                m["tokens"] = int(m["tokens"]) + 1
            elif code == SENTENCE_COMPLETE and resp:
                m["whole"] = True  # a whole reply in one callback: its token count is not known here
            text = dec.decode(resp or b"")
            if text:
                now = time.perf_counter()
                if not m["callbacks"]:
                    m["first"] = now
                m["last"] = now
                m["callbacks"] = int(m["callbacks"]) + 1
                ev = {"event": "text", "id": qid, "text": text, "mono": time.monotonic()}
                if not m["whole"]:
                    ev["tokens"] = int(m["held"])
                emit(ev)
                m["held"] = 0

        ended = threading.Lock()  # one end event a query: the query's own, or the overrun watch's

        def end(state: str, st: int, profile: object) -> None:
            first = float(m["first"]) or time.perf_counter()
            emit(
                {
                    "event": "end",
                    "id": qid,
                    "state": state,
                    "status": st,
                    "profile": profile,
                    **({"overran": over["tokens"]} if over["tokens"] else {}),
                    "measured": {
                        "ttft_ms": round((first - t0) * 1000, 3),
                        "gen_ms": round((float(m["last"] or first) - first) * 1000, 3),
                        "callbacks": m["callbacks"],
                        # the tokens Genie called back with (a text event may hold several: a character in
                        # pieces); unknown when the whole reply came in one callback
                        **({} if m["whole"] else {"tokens": m["tokens"]}),
                    },
                }
            )

        def overrun_watch() -> None:
            """Genie 1.21's lade ignores ABORT too: it would run on to EOS or a full context (minutes on a board).
            Past a grace period the reply is ended here and the helper exits, which stops Genie; the host starts
            a new helper for the next turn and re-sends the history (docs/genie.md)."""
            time.sleep(OVERRUN_GRACE_S)
            if self.in_query.is_set() and ended.acquire(blocking=False):
                end("complete", SUCCESS, None)
                sys.stderr.write(
                    f"genie_session: the dialog went on past max_tokens ({budget}) and did not stop when asked; "
                    "the helper exits to stop it (Genie 1.21's lade does this: docs/genie.md)\n"
                )
                sys.stderr.flush()
                os._exit(0)

        cb = QUERY_CB(on_token)
        self.in_query.set()
        try:
            st = self.f["GenieDialog_query"](self.dialog, prompt.encode("utf-8"), SENTENCE_COMPLETE, cb, None)
        finally:
            self.in_query.clear()
        tail = dec.decode(b"", final=True)
        if tail:
            emit(
                {
                    "event": "text",
                    "id": qid,
                    "text": tail,
                    **({} if m["whole"] else {"tokens": int(m["held"])}),
                }
            )
        if over["tokens"] and st >= SUCCESS:
            state = "complete"  # the reply reached max_tokens; what Genie made past it was dropped
        elif st < SUCCESS and not self.aborting:
            state = (
                "failed"  # an error ends the sentence with ABORT too: it is a failure, not a stop asked for
            )
        elif st == WARNING_CONTEXT_EXCEEDED:
            # the reply was cut short: the dialog's context is full, aborted or not (the dialog is made again, so
            # the host must clear its copy of the conversation and send the history again)
            state = "context_full"
        elif m["aborted"] or st in (WARNING_ABORTED, WARNING_PAUSED) or (st > 0 and self.aborting):
            state = "aborted"
        else:
            state = "complete" if st >= SUCCESS else "failed"  # other warnings (> 0): the reply completed
        self.aborting = False
        # Genie records a query's figures only when it ends normally or aborted (GenieDialog.cpp: a context
        # limit skips addProfileStat): otherwise the profile's last query is the turn before's
        profile = self.profile_json() if st in (SUCCESS, WARNING_ABORTED) else None
        if ended.acquire(blocking=False):
            end(state, st, profile)
        if st == WARNING_CONTEXT_EXCEEDED:
            # Genie 1.21 leaves the dialog counting the query as active (Dialog.cpp: the context-limit path skips
            # m_activeQuery--), so a later ABORT would be latched and cut the next reply to one token, through
            # resets: the dialog is made again before its next use (the host's reset, which a full context asks
            # for anyway), not here, where it would hold back the reply's end by a whole load
            self.remake = True

    aborting = False

    def abort(self) -> None:
        if self.in_query.is_set() and "GenieDialog_signal" in self.f:
            self.aborting = True
            self.f["GenieDialog_signal"](self.dialog, ACTION_ABORT)

    def apply_sampler(self, values: dict) -> str | None:
        """Sampler values for the next queries (GenieDialog_getSampler + GenieSampler_applyConfig); None when
        applied, else why not (an older libGenie has no sampler API)."""
        names = ("GenieDialog_getSampler", "GenieSamplerConfig_createFromJson", "GenieSampler_applyConfig")
        if not all(n in self.f for n in names):
            return "this libGenie has no sampler API (GenieSampler_applyConfig)"
        if greedy(self.created_sampler) != greedy({**self.created_sampler, **values}):
            # qualla sampler.cpp: the greedy shortcut (temp <= 0 or top-k 1) is fixed when the dialog is made and
            # applyConfig never changes it: the new values would be reported applied and do nothing
            return "a switch between greedy and sampled decoding needs the dialog made again"
        sampler, cfg = ctypes.c_void_p(), ctypes.c_void_p()
        st = self.f["GenieDialog_getSampler"](self.dialog, ctypes.byref(sampler))
        if st != SUCCESS:
            return f"GenieDialog_getSampler failed (status {st})"
        doc = json.dumps({"sampler": {"version": 1, **values}}).encode("utf-8")
        st = self.f["GenieSamplerConfig_createFromJson"](doc, ctypes.byref(cfg))
        if st != SUCCESS:
            return f"GenieSamplerConfig_createFromJson failed (status {st})"
        try:
            st = self.f["GenieSampler_applyConfig"](sampler, cfg)
        finally:
            if "GenieSamplerConfig_free" in self.f:
                self.f["GenieSamplerConfig_free"](cfg)
        if st == SUCCESS:
            self.sampler_values = dict(values)
        return None if st == SUCCESS else f"GenieSampler_applyConfig failed (status {st})"

    def recreate(self) -> tuple[int, float, str | None]:
        """The dialog made again from the same config (its KV cache empty, as a reset leaves it), with the last
        applied sampler values: (status, milliseconds, why the sampler was not applied)."""
        self.f["GenieDialog_free"](self.dialog)
        self.dialog = ctypes.c_void_p()
        t0 = time.perf_counter()
        st = self.f["GenieDialog_create"](self.cfg, ctypes.byref(self.dialog))
        self.remake = self.used = self.limited = False
        why = self.apply_sampler(self.sampler_values) if st == SUCCESS and self.sampler_values else None
        if st == SUCCESS and self.stop_values:  # the host holds them set on the dialog: it sends them no more
            why = self.set_stop(self.stop_values) or why
        return st, (time.perf_counter() - t0) * 1000, why

    def made_again(self, st: int) -> None:
        """After a recreate: a dialog that could not be made again leaves no dialog to query; the helper exits
        (status 5) and the host starts a new one for the next turn, as after any helper that ends."""
        if st != SUCCESS:
            sys.stderr.write(
                f"genie_session: GenieDialog_create failed (status {st}) when making the dialog again; the "
                "helper exits and the next turn loads the model afresh\n"
            )
            sys.stderr.flush()
            os._exit(5)

    def reset(self) -> None:
        # Genie 1.21's spd reset clears its per-length acceptance counts to an empty vector (qualla
        # dialogs/spec-dec.cpp SpecDecDialog::reset: `_accepted_counts.clear()`), which the next query then
        # indexes past its end and divides by (token-acceptance-rate null, measured): an spd dialog is made again
        # instead, unless nothing ran on it since it was made. A dialog a full context left stale is made again.
        if self.remake or (self.dialog_type == "spd" and self.used):
            # the host counts a dialog made again at its reset as holding the config's stops only
            self.stop_values = None
            st, ms, why = self.recreate()
            emit(
                {
                    "event": "reset",
                    "status": st,
                    "recreated": True,
                    "init_ms": round(ms, 3),
                    **({"sampler": why} if why else {}),
                }
            )
            self.made_again(st)
            return
        if self.dialog_type == "spd":
            emit({"event": "reset", "status": SUCCESS, "recreated": False})
            return
        st = self.f["GenieDialog_reset"](self.dialog) if "GenieDialog_reset" in self.f else -1
        emit({"event": "reset", "status": st})

    def close(self) -> None:
        if self.dialog:
            self.f["GenieDialog_free"](self.dialog)
        # the config before the profile: GenieProfile_free refuses a profile still bound to a config
        # (GENIE_STATUS_ERROR_BOUND_HANDLE), and freeing the config unbinds it
        if self.cfg and "GenieDialogConfig_free" in self.f:
            self.f["GenieDialogConfig_free"](self.cfg)
        if self.profile and "GenieProfile_free" in self.f:
            self.f["GenieProfile_free"](self.profile)
        if self.log and "GenieLog_free" in self.f:
            self.f["GenieLog_free"](self.log)


def orphan_watch(parent: int) -> None:
    """Exit when the process that started us is gone (a killed studio, a dropped SSH session): a query in
    flight never reads stdin's EOF, and an orphaned dialog would hold the NPU (or the CPU) for nothing."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(3)


def merge(base: dict, extra: dict) -> None:
    """Deep-merge `extra` into `base` (objects merged key by key, anything else replaced)."""
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merge(base[k], v)
        else:
            base[k] = v


def merge_engines(dialog: dict, extra: dict) -> None:
    """Merge engine settings (the x86 simulator's n-threads, poll...) into every engine: one object, or spd's
    array of a draft and a target engine."""
    eng = dialog.setdefault("engine", {})
    for e in eng if isinstance(eng, list) else [eng]:
        if isinstance(e, dict):
            merge(e, extra)


def dialog_sampler(dialog: dict, values: dict) -> dict:
    """Sampler values as this dialog can take them: Genie's spd asserts temp > 0 in the draft's sampler (a
    process abort, not a status), so a greedy request (temp 0) becomes temp 1 with top-k 1 there (greedy under
    either reading of "greedy": qualla sampler.cpp sets it again from temp <= 0 or top-k == 1), and a sampled
    one says "greedy": false (hexstudio.shared.bundle.speculative.spd_sampler: this file runs alone on a
    board, so the rule is written again here)."""
    out = dict(values)
    if dialog.get("type") == "spd":
        greedy = float(out.get("temp", 1.0) or 0.0) <= 0.0
        if greedy:
            out["temp"], out["top-k"] = 1.0, 1
        out["greedy"] = greedy
    return out


def main() -> int:
    # watched from the start: a studio or `serve` stopped during the load (minutes on the simulator) leaves no
    # dialog loading on the NPU for no one
    threading.Thread(target=orphan_watch, args=(os.getppid(),), daemon=True).start()
    ap = argparse.ArgumentParser(prog="genie_session.py")
    ap.add_argument("--config", required=True)
    ap.add_argument("--lib", default=os.environ.get("HEXSTUDIO_GENIE_LIB", "libGenie.so"))
    ap.add_argument("--sampler", default=None, help="JSON object merged into dialog.sampler")
    ap.add_argument(
        "--engine", default=None, help="JSON object merged into dialog.engine (e.g. the x86 simulator's)"
    )
    ap.add_argument("--log-level", default=None, choices=tuple(LOG_LEVELS), help="forward Genie's log lines")
    ap.add_argument(
        "--htp-simulator",
        action="store_true",
        help="libGenie runs on Qualcomm's x86 HTP simulator: label everything simulated",
    )
    args = ap.parse_args()
    try:
        why = not_regular(args.config)
        if why is not None:
            return fail("unsafe_path", f"{args.config}: {why}. Nothing was loaded.")
        with open(args.config, encoding="utf-8") as fh:
            cfg = json.load(fh)
        if args.sampler:
            sampler = cfg.setdefault("dialog", {}).setdefault("sampler", {})
            sampler.update(dialog_sampler(cfg["dialog"], json.loads(args.sampler)))
        if args.engine:
            merge_engines(cfg.setdefault("dialog", {}), json.loads(args.engine))
    except (OSError, ValueError, AttributeError) as exc:
        return fail("config_unreadable", f"Cannot read {args.config}: {exc}")
    unsafe = check_config_paths(cfg, os.path.dirname(os.path.abspath(args.config)))
    if unsafe is not None:
        return fail("unsafe_path", unsafe)
    try:
        lib = ctypes.CDLL(args.lib)
    except OSError as exc:
        return fail(
            "lib_not_found",
            f"Cannot load {args.lib}: {exc}. Source the QAIRT environment "
            "(LD_LIBRARY_PATH must hold libGenie.so).",
        )
    try:
        fns = bind(lib)
    except AttributeError as exc:
        return fail("lib_incompatible", f"{args.lib} lacks the GenieDialog API: {exc}")
    try:
        h = Helper(fns, json.dumps(cfg), args.log_level)
    except RuntimeError as exc:
        return fail("dialog_create_failed", str(exc), 1)
    ctx = ((cfg.get("dialog") or {}).get("context") or {}).get("size")
    # --htp-simulator: the studio runs this helper on its own x86 machine, where libQnnHtp is Qualcomm's HTP
    # simulator (no Hexagon NPU sits in a PC): every figure is simulated, never a device result.
    on_sim = bool(args.htp_simulator)
    emit(
        {
            "event": "ready",
            "genie_version": h.version(),
            "init_ms": round(h.init_ms, 3),
            "context_length": ctx,
            "profile": bool(h.profile),
            "pid": os.getpid(),
            "simulated": on_sim,
            "stop_sequences": "GenieDialog_setStopSequence" in h.f,
            "runner": f"Genie {h.version()} on the HTP simulator (x86)" if on_sim else f"Genie {h.version()}",
        }
    )
    ops = read_commands(h.abort)
    try:
        while True:
            msg = ops.get()
            if msg is None or msg.get("op") == "quit":
                return 0
            if msg.get("op") == "query":
                if h.remake:  # a full context left the dialog stale and no reset came between
                    h.made_again(h.recreate()[0])
                h.used = True
                if "stop" in msg:
                    why = h.set_stop(msg.get("stop"))
                    emit({"event": "stop", "id": msg.get("id"), "applied": why is None, "message": why})
                h.query(msg.get("id"), str(msg.get("prompt", "")), msg.get("max_tokens"))
            elif msg.get("op") == "reset":
                h.reset()
            elif msg.get("op") == "sampler":
                given = msg.get("sampler")
                values = given if isinstance(given, dict) else {}
                why = h.apply_sampler(dialog_sampler(cfg.get("dialog") or {}, values))
                emit({"event": "sampler", "applied": why is None, "message": why})
            else:
                bad_request(f"unknown op {msg.get('op')!r}")
    finally:
        h.close()


if __name__ == "__main__":
    sys.exit(main())
