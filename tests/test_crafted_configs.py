"""Crafted config.json files (issue 27 #2): every number a model's config gives is bounded before anything is
sized from it. `hexstudio model inspect` and `hexstudio preflight` on each crafted folder answer with a message
naming the field, in under 5 s and 500 MB (peak RSS of the real CLI process), with no traceback; the rope
tables and the part plan are never computed from such a value."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hexstudio.shared import config_bounds, modelinfo, rope

BASE = json.loads(
    (
        Path(__file__).resolve().parents[1] / "hexstudio/shared/data/builtin_model/tiny-llama/config.json"
    ).read_text()
)

CRAFTED: list[tuple[str, dict[str, Any], str]] = [
    ("hidden_size 1e12", {"hidden_size": 1_000_000_000_000}, "hidden_size"),
    ("hidden_size -5", {"hidden_size": -5}, "hidden_size"),
    ("hidden_size as text", {"hidden_size": "1e12"}, "hidden_size"),
    ("hidden_size true", {"hidden_size": True}, "hidden_size"),
    ("layers 1e9", {"num_hidden_layers": 1_000_000_000}, "num_hidden_layers"),
    ("heads 0", {"num_attention_heads": 0}, "num_attention_heads"),
    ("kv heads above heads", {"num_key_value_heads": 64}, "num_key_value_heads"),
    ("kv heads not dividing heads", {"num_key_value_heads": 3}, "num_key_value_heads"),
    ("head_dim 1e9", {"head_dim": 1_000_000_000}, "head_dim"),
    ("intermediate 1e15", {"intermediate_size": 10**15}, "intermediate_size"),
    ("vocab 1e12", {"vocab_size": 10**12}, "vocab_size"),
    ("max positions 1e15", {"max_position_embeddings": 10**15}, "max_position_embeddings"),
    ("rope_theta 1e300", {"rope_theta": 1e300, "rope_parameters": None}, "rope_theta"),
    ("rope_theta NaN", {"rope_theta": math.nan, "rope_parameters": None}, "rope_theta"),
    ("rope factor 1e308", {"rope_scaling": {"rope_type": "linear", "factor": 1e308}}, "rope_scaling.factor"),
    (
        "longrope factors 1e6 long",
        {
            "rope_scaling": {
                "rope_type": "longrope",
                "factor": 2.0,
                "short_factor": [1.0] * 1_000_000,
                "long_factor": [1.0],
            }
        },
        "rope_scaling.short_factor",
    ),
    (
        "rope_parameters theta 1e300",
        {"rope_theta": None, "rope_parameters": {"rope_type": "default", "rope_theta": 1e300}},
        "rope_parameters.rope_theta",
    ),
    ("eos list 1e5 long", {"eos_token_id": list(range(100_000))}, "eos_token_id"),
    ("architectures a number", {"architectures": 5}, "architectures"),
]


def _write(folder: Path, changes: dict[str, Any]) -> Path:
    cfg = {**BASE, **changes}
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return folder


@pytest.mark.parametrize(("what", "changes", "field"), CRAFTED, ids=[c[0] for c in CRAFTED])
def test_bounds_refuse_before_sizing(what: str, changes: dict[str, Any], field: str) -> None:
    cfg = {**BASE, **{k: v for k, v in changes.items() if v is not None}}
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
    with pytest.raises(config_bounds.ConfigBoundsError) as e:
        config_bounds.check_config(cfg)
    assert field in e.value.message and e.value.hint, e.value.message
    info = modelinfo.inspect_config(cfg)
    assert info["supported"] is False and field in info["reason"] and "num_parameters" not in info
    with pytest.raises(ValueError):  # the rope tables are never sized from it either
        rope.genie_positional_encoding(cfg, 512)


def test_real_configs_stay_accepted() -> None:
    config_bounds.check_config(BASE)
    llama405 = {
        **BASE,
        "hidden_size": 16384,
        "num_hidden_layers": 126,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 53248,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    config_bounds.check_config(llama405)
    info = modelinfo.inspect_config(llama405)
    assert info["supported"] and info["num_parameters"] > 400e9


def _run_measured(argv: list[str], env: dict[str, str]) -> tuple[int, str, float, float]:
    """(exit status, output, wall seconds, peak RSS MiB) of a real CLI process. The peak is sampled with psutil
    every 10 ms: ru_maxrss would carry the forking test process's own peak across exec (Linux keeps the old
    mm's high-water mark), 1.2 GB late in a full session."""
    import threading

    import psutil

    t0 = time.monotonic()
    with open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            argv, env=env, stdin=devnull, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        try:
            p = psutil.Process(proc.pid)
            while not done.is_set():
                peak[0] = max(peak[0], p.memory_info().rss)
                time.sleep(0.01)
        except psutil.Error:
            pass

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out = b""
    assert proc.stdout is not None
    for chunk in iter(lambda: proc.stdout.read(65536), b""):  # type: ignore[union-attr]
        out += chunk
    proc.stdout.close()
    proc.wait()
    done.set()
    th.join()
    return proc.returncode, out.decode("utf-8", "replace"), time.monotonic() - t0, peak[0] / 2**20


CLI_CASES = [
    c
    for c in CRAFTED
    if c[0]
    in (
        "hidden_size 1e12",
        "layers 1e9",
        "vocab 1e12",
        "head_dim 1e9",
        "rope factor 1e308",
        "longrope factors 1e6 long",
        "max positions 1e15",
    )
]


@pytest.mark.parametrize(("what", "changes", "field"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_inspect_and_preflight_bounded(
    what: str, changes: dict[str, Any], field: str, tmp_path: Path
) -> None:
    folder = _write(tmp_path / "model", changes)
    env = {**os.environ, "HEXSTUDIO_WORKSPACE": str(tmp_path / "ws")}
    for argv in (
        [sys.executable, "-m", "hexstudio", "model", "inspect", str(folder)],
        [sys.executable, "-m", "hexstudio", "preflight", "--model", str(folder)],
    ):
        rc, out, wall, peak = _run_measured(argv, env)
        assert rc != 0 and field in out and "No real model has that" in out, (argv, out)
        assert "Traceback" not in out, out
        assert wall < 5, (what, argv[3], wall)
        assert peak < 500, (what, argv[3], peak)
    assert not (tmp_path / "ws" / "runs").exists() or not any((tmp_path / "ws" / "runs").iterdir())


def test_a_local_copy_of_the_builtin_model_inspects_without_a_context_error(tmp_path: Path) -> None:
    """Issue 27 #8: "auto" took 4096 for any model but the built-in one, so a local copy of it (2048 positions)
    was told "context_length 4096 beyond 2048"; auto now stops at the model's own limit."""
    import shutil

    from hexstudio.shared.data import builtin_model_dir

    d = tmp_path / "tiny-copy"
    shutil.copytree(builtin_model_dir(), d)
    r = subprocess.run(
        [sys.executable, "-m", "hexstudio", "model", "inspect", str(d), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HEXSTUDIO_WORKSPACE": str(tmp_path / "ws")},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["supported"] and doc["context_length"] == BASE["max_position_embeddings"], doc
