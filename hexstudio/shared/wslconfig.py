"""The Windows user's `.wslconfig`: find it from inside WSL, read its [wsl2] memory/swap, plan and write
new limits without losing anything else in the file.

WSL2 runs Linux in a VM whose memory is capped below the Windows RAM (by default half of it). A
quantization that needs more is OOM-killed. The fix is `%UserProfile%\\.wslconfig`:

    [wsl2]
    memory=176GB
    swap=96GB

followed by `wsl --shutdown`. This module edits only those two keys of the [wsl2] section, keeps every
other section, key, comment, the file's encoding and its line endings, never lowers a limit the user
already set, backs the old file up before writing, and is idempotent. Stdlib only (no Qt, no hexstudio.core).
"""

from __future__ import annotations

import codecs
import difflib
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexstudio.shared.errors import ActionableError

GiB = 1024**3
ENV_OVERRIDE = "HEXSTUDIO_WSLCONFIG"
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "g": GiB,
    "gb": GiB,
    "t": 1024**4,
    "tb": 1024**4,
}
_SECTION = re.compile(r"^\s*\[([^\]]+)\]\s*(?:[#;].*)?$")


def parse_size(value: str | None) -> int | None:
    """'176GB' -> bytes (WSL's GB are binary). None when missing or unreadable."""
    if value is None:
        return None
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?b?)\s*", value.lower())
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def target_limits(need_bytes: int) -> tuple[int, int]:
    """memory/swap in GB for a job that peaks at need_bytes: 25 % headroom for the desktop, page cache
    and the studio itself; swap half of that (at least 16 GB) as a cushion, not as working memory."""
    memory = math.ceil(need_bytes * 1.25 / GiB) + 1
    return memory, max(16, memory // 2)


# ------------------------------------------------------------------------------------------------
# finding the file


Runner = Callable[[list[str]], str]
# where WSL mounts Windows' cmd.exe (the C: drive at /mnt/c, WSL's default automount root)
WINDOWS_CMD = "/mnt/c/Windows/System32/cmd.exe"


def _run(cmd: list[str]) -> str:
    if not shutil.which(cmd[0]):
        return ""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def locate(env: Mapping[str, str] | None = None, run: Runner = _run) -> Path | None:
    """The Windows user's .wslconfig as a Linux path (it need not exist yet), or None outside WSL.

    $HEXSTUDIO_WSLCONFIG wins (tests, unusual set-ups); otherwise %USERPROFILE% from wslvar or cmd.exe (on
    PATH, else at WINDOWS_CMD), translated by wslpath."""
    env = os.environ if env is None else env
    if env.get(ENV_OVERRIDE):
        return Path(env[ENV_OVERRIDE]).expanduser()
    profile = ""
    # cmd.exe by its place too: with `appendWindowsPath=false` in /etc/wsl.conf it is not on PATH
    for cmd in (
        ["wslvar", "USERPROFILE"],
        ["cmd.exe", "/c", "echo %USERPROFILE%"],
        [WINDOWS_CMD, "/c", "echo %USERPROFILE%"],
    ):
        profile = run(cmd).strip()
        if profile and "%" not in profile:
            break
        profile = ""
    if not profile:
        return None
    home = run(["wslpath", "-u", profile]).strip()
    return Path(home) / ".wslconfig" if home else None


# ------------------------------------------------------------------------------------------------
# reading and editing the text


@dataclass
class Text:
    """A .wslconfig's text plus how to write it back the same way."""

    text: str
    encoding: str = "utf-8"
    bom: bytes = b""
    newline: str = "\n"

    @classmethod
    def decode(cls, data: bytes) -> Text:
        for bom, enc in (
            (codecs.BOM_UTF8, "utf-8"),
            (codecs.BOM_UTF16_LE, "utf-16-le"),
            (codecs.BOM_UTF16_BE, "utf-16-be"),
        ):
            if data.startswith(bom):
                text = data[len(bom) :].decode(enc, errors="replace")
                return cls(text, enc, bom, "\r\n" if "\r\n" in text else "\n")
        text = data.decode("utf-8", errors="replace")
        return cls(text, "utf-8", b"", "\r\n" if "\r\n" in text else "\n")

    def encode(self, text: str) -> bytes:
        return self.bom + text.encode(self.encoding)


def read_limits(text: str) -> dict[str, str | None]:
    """The memory= and swap= values of the [wsl2] section, as written (None when absent)."""
    out: dict[str, str | None] = {"memory": None, "swap": None}
    section = None
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            section = m.group(1).strip().lower()
            continue
        if section != "wsl2" or line.lstrip().startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        k = key.strip().lower()
        if k in out and out[k] is None:
            out[k] = re.split(r"\s[#;]", value, maxsplit=1)[0].strip()
    return out


def apply_limits(text: str, values: Mapping[str, str], newline: str = "\n") -> str:
    """Set keys of [wsl2] (e.g. {"memory": "176GB"}), in place where they exist, else at the end of the
    section; add the section when the file has none. Everything else is kept byte for byte."""
    lines = text.splitlines(keepends=True)
    start = end = None
    for i, line in enumerate(lines):
        m = _SECTION.match(line.rstrip("\r\n"))
        if m:
            if start is not None and end is None:
                end = i
            if start is None and m.group(1).strip().lower() == "wsl2":
                start = i
    if start is not None and end is None:
        end = len(lines)
    todo = dict(values)
    if start is None or end is None:
        out = "".join(lines)
        if out and not out.endswith(("\n", "\r")):
            out += newline
        if out.strip():
            out += newline
        out += f"[wsl2]{newline}" + "".join(f"{k}={v}{newline}" for k, v in todo.items())
        return out
    for i in range(start + 1, end):
        body = lines[i].rstrip("\r\n")
        ending = lines[i][len(body) :]
        if body.lstrip().startswith(("#", ";")) or "=" not in body:
            continue
        key = body.split("=", 1)[0].strip().lower()
        if key in todo:
            m = re.match(r"^(\s*[^=]*?\s*=\s*)(.*?)(\s+[#;].*)?$", body)
            if m:
                lines[i] = f"{m.group(1)}{todo.pop(key)}{m.group(3) or ''}{ending}"
    if todo:
        last = start
        for i in range(start + 1, end):
            if lines[i].strip():
                last = i
        if not lines[last].endswith(("\n", "\r")):
            lines[last] += newline
        lines[last + 1 : last + 1] = [f"{k}={v}{newline}" for k, v in todo.items()]
    return "".join(lines)


# ------------------------------------------------------------------------------------------------
# planning and writing


@dataclass
class Plan:
    path: Path
    exists: bool
    current: dict[str, str | None]
    target: dict[str, str]
    old_text: str
    new_text: str
    fmt: Text
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.new_text != self.old_text

    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                self.old_text.splitlines(keepends=True),
                self.new_text.splitlines(keepends=True),
                fromfile=f"{self.path}{'' if self.exists else ' (does not exist yet)'}",
                tofile=f"{self.path} (new)",
            )
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "exists": self.exists,
            "current": self.current,
            "target": self.target,
            "changed": self.changed,
            "diff": self.diff(),
            "notes": self.notes,
        }


def plan(path: Path, memory_gb: int | None, swap_gb: int | None) -> Plan:
    """What to write so [wsl2] has at least memory_gb / swap_gb. A value already as large or larger is
    kept (never lowers a limit the user chose)."""
    exists = path.is_file()
    fmt = Text.decode(path.read_bytes()) if exists else Text("")
    current = read_limits(fmt.text)
    target: dict[str, str] = {}
    notes: list[str] = []
    for key, want in (("memory", memory_gb), ("swap", swap_gb)):
        if want is None:
            continue
        have = parse_size(current[key])
        if have is not None and have >= want * GiB:
            notes.append(f"{key}={current[key]} already covers {want}GB: kept.")
            continue
        target[key] = f"{want}GB"
    new_text = apply_limits(fmt.text, target, fmt.newline) if target else fmt.text
    return Plan(path, exists, current, target, fmt.text, new_text, fmt, notes)


def backup_path(path: Path, now: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    cand = path.with_name(f"{path.name}.hexstudio-backup-{stamp}")
    n = 1
    while cand.exists():
        n += 1
        cand = path.with_name(f"{path.name}.hexstudio-backup-{stamp}-{n}")
    return cand


class ChangedMeanwhile(ActionableError):
    """The file is not what the plan was made from: someone edited it while the change was shown."""


def write(p: Plan, now: float | None = None) -> Path | None:
    """Back the old file up (when there is one), then replace it atomically. Returns the backup's path.
    Does nothing when the plan changes nothing. ChangedMeanwhile, nothing written, when the file is not what the
    plan was made from (the user edited it in Notepad while the diff was shown: their edit is not undone)."""
    if not p.changed:
        return None
    try:
        held: bytes | None = p.path.read_bytes()
    except FileNotFoundError:
        held = None
    if (held is not None) != p.exists or (held is not None and Text.decode(held).text != p.old_text):
        raise ChangedMeanwhile(
            f"{p.path} changed since this change was planned (edited meanwhile?): nothing was written.",
            "Plan the change again from the file as it is now.",
        )
    backup = None
    if held is not None:
        backup = backup_path(p.path, now)
        with open(backup, "wb") as fh:  # on disk before the file it keeps is replaced
            fh.write(held)
            fh.flush()
            os.fsync(fh.fileno())
    data = p.fmt.encode(p.new_text)
    tmp = p.path.with_name(f".{p.path.name}.hexstudio.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, p.path)
    return backup
