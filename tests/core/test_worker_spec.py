"""The worker spec, declared once and typed on both sides (hexstudio/shared/worker_spec.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hexstudio.shared.predict import ModelShape, Target
from hexstudio.shared.run_settings import DEFAULTS, RunSettings
from hexstudio.shared.worker_spec import (
    SPEC_SCHEMA,
    EvalCase,
    EvalWork,
    PredictWork,
    SpecError,
    StageInputs,
    WorkerSpec,
)

REPO = Path(__file__).resolve().parents[2]


def test_a_spec_round_trips_typed_with_defaults_filled_and_only_what_was_set_written(tmp_path: Path) -> None:
    work = EvalWork(
        ("float", "sim"),
        (
            EvalCase("a", "generate", ("float",), prompt="Hi", max_tokens=8),
            EvalCase("b", "nll", ("float", "sim"), text="x"),
        ),
        tmp_path / "eval" / "host.jsonl",
    )
    spec = WorkerSpec.build(
        "evaluate",
        tmp_path,
        tmp_path / "out",
        {"context_length": 1024, "ar_n": 64, "parts": "auto", "seconds": 2, "kv_bits": None},
        upstream={"model": tmp_path / "m"},
        inputs=StageInputs(model="builtin:tiny-llama", board="sim"),
        evaluate=work,
    )
    path = spec.write(tmp_path / "specs" / "evaluate.json")
    raw = json.loads(path.read_text())
    assert raw["schema"] == SPEC_SCHEMA
    # what the run set (a null where a setting cannot be null is "unset"), plus the test hook; no default is written
    assert raw["settings"] == {"context_length": 1024, "ar_n": 64, "parts": "auto", "seconds": 2}
    back = WorkerSpec.load(path)
    assert back == spec
    assert isinstance(back.settings, RunSettings) and back.settings.context_length == 1024
    assert back.settings.kv_bits == DEFAULTS.kv_bits and not back.is_set("kv_bits") and back.is_set("ar_n")
    assert back.hooks == {"seconds": 2} and not hasattr(back.settings, "seconds")
    assert (
        back.evaluate == work and back.inputs.board == "sim" and back.upstream_dir("model") == tmp_path / "m"
    )
    with pytest.raises(SpecError) as ei:
        back.upstream_dir("quantize")
    assert ei.value.code == "missing_upstream" and "Run the quantize stage first" in str(ei.value.hint)


def test_the_predictors_request_round_trips(tmp_path: Path) -> None:
    shape = ModelShape(
        name="m", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=100
    )
    work = PredictWork(
        "m", shape, Target("Dragonwing IQ-9075 EVK", 77, "v73"), 512, 128, 1, True, tmp_path / "cache"
    )
    spec = WorkerSpec.build("predict", tmp_path, tmp_path / "out", {}, predict=work)
    assert WorkerSpec.load(spec.write(tmp_path / "spec.json")).predict == work


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"kv_bits": "8"}, ["kv_bits must be a whole number, not '8' (text)"]),
        ({"context_length": 100000000}, ["context_length 100000000 is out of range"]),
        ({"compile_target": "cloud", "ar_n": 1.5}, ["compile_target", "ar_n must be a whole number"]),
    ],
)
def test_a_bad_setting_stops_the_worker_before_it_starts_naming_it(
    tmp_path: Path, settings: dict[str, object], words: list[str]
) -> None:
    """A spec a person edited by hand, or one from another version: the worker says which setting and what to
    do, with the error shape every worker failure has, instead of failing hours later on a wrong type."""
    out = tmp_path / "out"
    path = tmp_path / "spec.json"
    path.write_text(
        json.dumps(
            {
                "schema": SPEC_SCHEMA,
                "stage": "selftest",
                "run_dir": str(tmp_path),
                "out_dir": str(out),
                "settings": settings,
            }
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "hexstudio.workers.selftest", "--spec", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    events = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    err = next(e for e in events if e["type"] == "error")
    assert proc.returncode == 1 and err["code"] == "bad_setting", events
    assert all(w in err["message"] for w in words), err["message"]
    assert "--set NAME=VALUE" in err["hint"]
    assert events[-1] == {**events[-1], "type": "done", "ok": False}


def test_no_worker_reads_a_setting_from_a_dict() -> None:
    """Workers read `spec.settings` (a RunSettings): no `settings.get(...)` / `settings["..."]`, and no
    default of their own for a setting (issue 30)."""
    pattern = re.compile(r"\bsettings(\.get\(|\[[\"'])")
    found = [
        f"{p.relative_to(REPO)}:{i}: {line.strip()}"
        for p in sorted((REPO / "hexstudio" / "workers").rglob("*.py"))
        if p.name != "run_settings.py"  # the declaration itself (resolve_settings takes run.json's mapping)
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
