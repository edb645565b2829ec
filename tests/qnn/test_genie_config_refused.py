"""A config Genie's parser refuses is said as a refused config, with Genie's own words: the helper's events kept
them from the person (Genie prints them on fd 1/2, before a logger can be bound), and the HTP-simulator
genie-t2t-run printed "Failed to create the dialog.", which the error decoder reads as a model that did not load."""

from __future__ import annotations

import json
import subprocess
import sys

from hexstudio.core.device.explain import explain
from tests.qnn.conftest import needs_qnn

pytestmark = [needs_qnn]

SCRIPT = r"""
import ctypes, json, sys
from hexstudio.workers.board import genie_session as gs
from hexstudio.workers.qnn.libs import find_qnn_libs

events = []
gs.emit = events.append
fns = gs.bind(ctypes.CDLL(str(find_qnn_libs().genie)))
cfg = {"dialog": {"version": 1, "type": "basic", "contxt": {"version": 1}}}  # a misspelt key
try:
    gs.Helper(fns, json.dumps(cfg), "warn")
except gs.ConfigRefused as exc:
    print(json.dumps({"refused": str(exc), "events": events}))
"""


def test_a_refused_config_says_genies_reason_and_is_decoded_as_a_config() -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])  # nothing of Genie's text on the event channel
    assert "the config is invalid. Genie said:" in out["refused"], out
    assert "contxt" in out["refused"] or "context" in out["refused"], out["refused"]
    # what genie-t2t-run on the HTP simulator now prints is decoded as the config, not the model's binaries
    assert next(m.id for m in explain("Failed to create the dialog config.")) == "genie_config_failed"
