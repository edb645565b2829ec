"""The uplink to AI Hub as the last upload measured it, so the next Compile stage's upload ETA is the user's own
link and not an assumed 100 Mbit/s (issue 28).

One file per workspace, `<workspace>/aihub-uplink.json`, one entry per AI Hub API address (the emulator on
localhost never stands in for Qualcomm's service). Each AI Hub compile rewrites its address's entry after every
upload with what it has sent so far: bytes the client sent (its zips) over the seconds that took (zip + send, as
the ETA means it). A run on a worker host measures that host's uplink, in that host's workspace.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FILE = "aihub-uplink.json"
MIN_BYTES = 1_000_000  # under this, an upload measures the round trip more than the link


@dataclass(frozen=True)
class UplinkRate:
    mbps: float
    bytes: int
    seconds: float
    measured_at: str  # UTC, ISO 8601 to the second

    def source(self) -> str:
        """Where the ETA's speed comes from, in the words the progress line shows."""
        return f"measured {self.measured_at[:10]} over {self.bytes / 1e9:.2f} GB; set aihub_link_mbps to override"


def read_rate(workspace: Path, api_url: str) -> UplinkRate | None:
    """The last measurement for `api_url`, or None (never measured, or an unreadable file: the ETA then assumes)."""
    try:
        doc = json.loads((workspace / FILE).read_text(encoding="utf-8"))
        e: dict[str, Any] = doc["uplinks"][api_url]
        rate = UplinkRate(float(e["mbps"]), int(e["bytes"]), float(e["seconds"]), str(e["measured_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return rate if rate.mbps > 0 else None


def record_rate(workspace: Path, api_url: str, n_bytes: float, seconds: float) -> UplinkRate | None:
    """Keep what an upload measured for `api_url` (atomically: a crash leaves the old file). Too small an upload
    is not a measurement of the link: None, nothing written."""
    if n_bytes < MIN_BYTES or seconds <= 0:
        return None
    rate = UplinkRate(
        mbps=round(n_bytes * 8 / seconds / 1e6, 3),
        bytes=int(n_bytes),
        seconds=round(seconds, 3),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    path = workspace / FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(doc.get("uplinks"), dict):
            raise ValueError
    except (OSError, ValueError, AttributeError):
        doc = {"schema": "hexstudio.aihub-uplink/1", "uplinks": {}}
    doc["uplinks"][api_url] = asdict(rate)
    workspace.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".aihub-uplink.", dir=workspace)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return None  # the ETA is a convenience: a full disk must not fail the compile
    return rate
