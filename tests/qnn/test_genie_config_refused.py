"""A config Genie's parser refuses is said as a refused config, with Genie's own words: the helper's events kept
them from the person (Genie prints them on fd 1/2, before a logger can be bound), and the HTP-simulator
genie-t2t-run printed "Failed to create the dialog.", which the error decoder reads as a model that did not load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hexstudio.core.device.explain import explain
from hexstudio.shared import bundle as gb
from hexstudio.shared.data import builtin_model_dir
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


def test_genie_t2t_run_on_the_htp_simulator_ends_a_refused_config_as_genie_t2t_run_does(
    tmp_path: Path,
) -> None:
    hf = json.loads((builtin_model_dir() / "config.json").read_text())
    cfg = gb.genie_config(hf, 256, ["m_part_1_of_1.bin"], 64)
    cfg["dialog"]["contxt"] = cfg["dialog"].pop("context")  # a misspelt key
    (tmp_path / "genie_config.json").write_text(json.dumps(cfg))
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "m_part_1_of_1.bin").write_bytes(b"\0" * 64)
    t2t = [sys.executable, "-m", "hexstudio.workers.qnn.genie_t2t", "-c", "genie_config.json", "-p", "hi"]
    r = subprocess.run(t2t, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stdout.splitlines()[-1] == "Failed to create the dialog config.", r.stdout
    assert "Failure to initialize model" not in r.stdout
    assert "required property 'context' not found" in r.stderr, r.stderr  # Genie's own words
    # decoded as the config, and only as the config (not "could not load the model's context binaries")
    assert [m.id for m in explain(r.stdout + r.stderr)] == ["genie_config_failed"]
