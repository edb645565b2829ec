"""Parse genie-t2t-run's stdout: banner, [PROMPT], [BEGIN] ... [END] (or [ABORT]), log lines and the
old [KPIS] block. Works on a whole transcript and incrementally on chunks as they stream in."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

LOG_RE = re.compile(r"^\[(INFO|WARN|WARNING|ERROR|VERBOSE)\]\s+(.*)$")
# [BEGIN]: starts a streamed reply; [COMPLETE]: a reply delivered whole; [RESUME]: continues one after a pause
START_MARKERS = ("[BEGIN]:", "[COMPLETE]:", "[RESUME]:")
KPI_RE = {
    "init_us": re.compile(r"Init Time:\s*(\d+)\s*us"),
    "prompt_us": re.compile(r"Prompt Processing Time:\s*(\d+)\s*us"),
    "prompt_rate": re.compile(r"Prompt Processing Rate\s*:\s*([\d.]+)\s*toks/sec"),
    "gen_us": re.compile(r"Token Generation Time:\s*(\d+)\s*us"),
    "gen_rate": re.compile(r"Token Generation Rate:\s*([\d.]+)\s*toks/sec"),
}


@dataclass
class Transcript:
    genie_version: str | None = None
    simulated: bool = False
    prompt: str | None = None
    text: str = ""
    state: str = "not_started"        # not_started | streaming | complete | aborted | crashed
    logs: list[dict[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    kpis_block: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class TranscriptParser:
    """Feed stdout chunks; `on_text` gets reply text as soon as it arrives."""

    def __init__(self) -> None:
        self.t = Transcript()
        self._buf = ""
        self._after_begin = False
        self._one_shot = False

    def feed(self, chunk: str) -> str:
        """Returns the reply text contained in this chunk."""
        self._buf += chunk
        out = ""
        while self._buf:
            if self.t.state == "streaming":
                if self._after_begin:  # the single space after "[BEGIN]:" is not reply text
                    if self._buf.startswith(" "):
                        self._buf = self._buf[1:]
                    self._after_begin = False
                    continue
                end = min((i for i in (self._buf.find("[END]"), self._buf.find("[ABORT]")) if i >= 0), default=-1)
                if end < 0:
                    # keep a tail that could be the start of a marker
                    keep = 0
                    for n in range(1, 8):
                        if "[END]"[:n] == self._buf[-n:] or "[ABORT]"[:n] == self._buf[-n:]:
                            keep = n
                    text, self._buf = (self._buf[:-keep], self._buf[-keep:]) if keep else (self._buf, "")
                    self.t.text += text
                    out += text
                    break
                text = self._buf[:end]
                self.t.text += text
                out += text
                aborted = self._buf.startswith("[ABORT]", end)
                self.t.state = "aborted" if aborted else "complete"
                self._buf = self._buf[end + (7 if aborted else 5):]
                continue
            nl = self._buf.find("\n")
            found = [(i, m) for m in START_MARKERS if (i := self._buf.find(m)) >= 0 and (nl < 0 or i < nl)]
            if found:
                begin, marker = min(found)
                self._line(self._buf[:begin])
                self._buf = self._buf[begin + len(marker):]
                self._after_begin = True
                self._one_shot = marker == "[COMPLETE]:"
                self.t.state = "streaming"
                if not self._buf:
                    break
                continue
            if nl < 0:
                # a start marker may be arriving in pieces: wait for the rest of the line
                break
            self._line(self._buf[:nl])
            self._buf = self._buf[nl + 1:]
        return out

    def _line(self, line: str) -> None:
        line = line.rstrip("\r")
        if not line.strip():
            return
        if line.startswith("Using libGenie.so version"):
            self.t.genie_version = line.split("version", 1)[1].split()[0]
            self.t.simulated = "simulator" in line.lower()
            return
        if line.startswith("[PROMPT]:"):
            self.t.prompt = line[len("[PROMPT]:"):].strip()
            return
        m = LOG_RE.match(line.strip())
        if m:
            level = m.group(1).lower().replace("warning", "warn")
            msg = m.group(2).strip().strip('"')
            self.t.logs.append({"level": level, "message": msg})
            if level == "error":
                self.t.errors.append(msg)
            return
        for key, rx in KPI_RE.items():
            km = rx.search(line)
            if km:
                self.t.kpis_block[key] = float(km.group(1))
        if any(s in line for s in ("Failed to create the dialog", "Failure to initialize model", "ERROR")):
            self.t.errors.append(line.strip())

    def finish(self, exit_status: int | None = None) -> Transcript:
        if self._buf:
            if self.t.state == "streaming":
                self.t.text += self._buf
            else:
                self._line(self._buf)
            self._buf = ""
        if self.t.state == "streaming" and self._one_shot and exit_status in (0, None):
            self.t.text = self.t.text.rstrip("\n")
            self.t.state = "complete"
        if self.t.state == "streaming" or (exit_status not in (0, None) and self.t.state != "complete"):
            self.t.state = "crashed"
        return self.t


def parse_transcript(text: str, exit_status: int | None = 0) -> Transcript:
    p = TranscriptParser()
    p.feed(text)
    return p.finish(exit_status)
