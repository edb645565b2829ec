"""Parse genie-t2t-run's stdout: banner, [PROMPT], [BEGIN] ... [END] (or [ABORT]), log lines and the
old [KPIS] block. Works on a whole transcript and incrementally on chunks as they stream in.

genie-t2t-run echoes the prompt as `[PROMPT]: <prompt>` with its real newlines, so a prompt can hold
text that looks like a marker (`[BEGIN]:`), a log line or an error. Markers count only at the start
of a line, and the echoed prompt is skipped: exactly, when the caller passes the prompt it sent;
otherwise up to the blank line that follows it (stdout shape: `[PROMPT]: <prompt>\\n\\n[BEGIN]: `).
Log lines that interleave with a streamed reply (`[INFO]  "KV cache update"`) go to the logs, not
into the reply text.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

LEVELS = ("INFO", "WARN", "WARNING", "ERROR", "VERBOSE")
LOG_RE = re.compile(r"^\[(INFO|WARN|WARNING|ERROR|VERBOSE)\]\s+(.*)$")
# a log line inside a streamed reply: the level tag, blanks, a quoted message, the line's end
INLINE_LOG_RE = re.compile(r"\[(INFO|WARN|WARNING|ERROR|VERBOSE)\][ \t]+\"([^\"\n]*)\"[ \t\r]*\n")
_INLINE_LOG_TAIL_RE = re.compile(r"[ \t]*|[ \t]+\"[^\"\n]*(\"[ \t\r]*)?")
# [BEGIN]: starts a streamed reply; [COMPLETE]: a reply delivered whole; [RESUME]: continues one after a pause
START_MARKERS = ("[BEGIN]:", "[COMPLETE]:", "[RESUME]:")
END_MARKERS = ("[END]", "[ABORT]")
PROMPT_MARKER = "[PROMPT]:"
KPIS_MARKER = "[KPIS]:"
# lines of genie-t2t-run's own that say it failed (at the start of a line: never inside the prompt or reply)
FAILURE_LINES = ("Failed to create the dialog", "Failure to initialize model", "ERROR")
KPI_RE = {
    "init_us": re.compile(r"Init Time:\s*(\d+)\s*us"),
    "prompt_us": re.compile(r"Prompt Processing Time:\s*(\d+)\s*us"),
    "prompt_rate": re.compile(r"Prompt Processing Rate\s*:\s*([\d.]+)\s*toks/sec"),
    "gen_us": re.compile(r"Token Generation Time:\s*(\d+)\s*us"),
    "gen_rate": re.compile(r"Token Generation Rate\s*:\s*([\d.]+)\s*toks/sec"),
}


@dataclass
class Transcript:
    genie_version: str | None = None
    simulated: bool = False
    prompt: str | None = None
    text: str = ""
    state: str = "not_started"  # not_started | streaming | complete | aborted | crashed
    logs: list[dict[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    kpis_block: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _could_be_inline_log(s: str) -> bool:
    """`s` (starting with '[', no newline yet) may still become a log line once more arrives."""
    for level in LEVELS:
        tag = f"[{level}]"
        if len(s) <= len(tag):
            if tag.startswith(s):
                return True
        elif s.startswith(tag) and _INLINE_LOG_TAIL_RE.fullmatch(s[len(tag) :]):
            return True
    return False


class TranscriptParser:
    """Feed stdout chunks; `feed` returns the reply text they hold as soon as it arrives.

    `prompt`: the exact prompt text sent (the prompt file's content), so its echo is skipped exactly."""

    MAX_HELD = 2000  # reply text held back while it might still be a log line

    def __init__(self, prompt: str | None = None) -> None:
        self.t = Transcript()
        self._buf = ""
        self._after_begin = False
        self._one_shot = False
        self._sent_prompt = prompt
        self._in_prompt = False  # inside an echoed prompt whose text we do not know (up to a blank line)
        self._in_kpis = False

    def feed(self, chunk: str) -> str:
        """Returns the reply text contained in this chunk."""
        self._buf += chunk
        out = ""
        while self._buf:
            if self.t.state == "streaming":
                text, more = self._stream()
                out += text
                if not more:
                    break
                continue
            # here the buffer starts at the beginning of a line
            if self._buf.startswith(PROMPT_MARKER) and not self._in_prompt:
                wait = self._prompt_echo()
                if wait:
                    break
                continue
            if not self._in_prompt:
                marker = next((m for m in START_MARKERS if self._buf.startswith(m)), None)
                if marker is not None:
                    self._buf = self._buf[len(marker) :]
                    self._after_begin = True
                    self._one_shot = marker == "[COMPLETE]:"
                    self._in_kpis = False
                    self.t.state = "streaming"
                    continue
                if any(m.startswith(self._buf) for m in (*START_MARKERS, PROMPT_MARKER)):
                    break  # a marker arriving in pieces: wait for the rest
            nl = self._buf.find("\n")
            if nl < 0:
                break  # wait for the rest of the line
            self._line(self._buf[:nl])
            self._buf = self._buf[nl + 1 :]
        return out

    def _prompt_echo(self) -> bool:
        """At `[PROMPT]:`. Skip the echo; True when more output is needed first."""
        rest = self._buf[len(PROMPT_MARKER) :]
        sent = self._sent_prompt
        if sent is not None:
            for echo in (" " + sent, sent):
                if rest.startswith(echo):
                    self.t.prompt = sent
                    self._buf = rest[len(echo) :]
                    self._sent_prompt = None  # only the first echo is the prompt
                    return False
                if echo.startswith(rest):
                    return True  # the echo is still arriving
            # the runner echoed something else (e.g. changed line endings): fall back to the blank-line rule
        nl = rest.find("\n")
        if nl < 0:
            return True
        self.t.prompt = rest[:nl].rstrip("\r").removeprefix(" ")
        self._buf = rest[nl + 1 :]
        self._in_prompt = True
        return False

    def _stream(self) -> tuple[str, bool]:
        """In a reply: returns (reply text, whether the buffer can be processed further now)."""
        if self._after_begin:  # the single space after "[BEGIN]:" is not reply text
            if self._buf.startswith(" "):
                self._buf = self._buf[1:]
            self._after_begin = False
            return "", bool(self._buf)
        buf = self._buf
        pos = 0
        while True:
            i = buf.find("[", pos)
            if i < 0:
                self._buf = ""
                return self._text(buf), False
            tail = buf[i:]
            for m in END_MARKERS:
                if tail.startswith(m):
                    aborted = m == "[ABORT]"
                    self.t.state = "aborted" if aborted else "complete"
                    self._buf = tail[len(m) :]
                    return self._text(buf[:i]), bool(self._buf)
            lm = INLINE_LOG_RE.match(buf, i)
            if lm:
                self._log(lm.group(1), lm.group(2))
                self._buf = buf[:i] + buf[lm.end() :]
                return "", True
            maybe_marker = any(m.startswith(tail) for m in END_MARKERS)
            if (maybe_marker or ("\n" not in tail and _could_be_inline_log(tail))) and len(
                tail
            ) <= self.MAX_HELD:
                self._buf = tail  # may be a marker or a log line still arriving: hold it back
                return self._text(buf[:i]), False
            pos = i + 1

    def _text(self, text: str) -> str:
        self.t.text += text
        return text

    def _log(self, level: str, message: str) -> None:
        level = level.lower().replace("warning", "warn")
        msg = message.strip().strip('"')
        self.t.logs.append({"level": level, "message": msg})
        if level == "error":
            self.t.errors.append(msg)

    def _line(self, line: str) -> None:
        line = line.rstrip("\r")
        if self._in_prompt:  # the rest of an echoed prompt we were not told: up to the blank line
            if line.strip():
                self.t.prompt = f"{self.t.prompt}\n{line}"
                return
            self._in_prompt = False
            return
        if not line.strip():
            return
        if self.t.state == "not_started" and line.startswith(END_MARKERS):
            # genie-t2t-run prints [BEGIN] with the first token: a reply whose first token is an EOS (or one aborted
            # before it) prints only its end (qualla basic.cpp calls back with END alone)
            self.t.state = "aborted" if line.startswith("[ABORT]") else "complete"
            return
        if line.startswith("Using libGenie.so version"):
            self.t.genie_version = line.split("version", 1)[1].split()[0]
            self.t.simulated = "simulator" in line.lower() or "simulated" in line.lower()
            return
        m = LOG_RE.match(line)
        if m:
            self._log(m.group(1), m.group(2))
            return
        if line.startswith(KPIS_MARKER):
            self._in_kpis = True
            line = line[len(KPIS_MARKER) :]
        if self._in_kpis:
            for key, rx in KPI_RE.items():
                km = rx.search(line)
                if km:
                    self.t.kpis_block[key] = float(km.group(1))
            return
        if line.startswith(FAILURE_LINES):
            self.t.errors.append(line.strip())

    def finish(self, exit_status: int | None = None) -> Transcript:
        if self._buf:
            if self.t.state == "streaming":
                self.t.text += self._buf
            elif self._buf.startswith(PROMPT_MARKER) and self.t.prompt is None:
                self.t.prompt = self._buf[len(PROMPT_MARKER) :].removeprefix(" ")
            else:
                self._line(self._buf)
            self._buf = ""
        if self.t.state == "streaming" and self._one_shot and exit_status in (0, None):
            self.t.text = self.t.text.rstrip("\n")
            self.t.state = "complete"
        if self.t.state == "streaming" or (exit_status not in (0, None) and self.t.state != "complete"):
            self.t.state = "crashed"
        return self.t


def parse_transcript(text: str, exit_status: int | None = 0, prompt: str | None = None) -> Transcript:
    p = TranscriptParser(prompt)
    p.feed(text)
    return p.finish(exit_status)
