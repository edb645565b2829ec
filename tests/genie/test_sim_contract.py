"""The simulator board refuses what Genie refuses, with Genie's own messages, and what a board would load
but run wrong, saying so (issue 17's faults); the same faults are refused by `hexstudio bundle check`."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hexstudio.shared.bundle.check import check_bundle, errors
from tests.support.cli import sim_t2t_argv

BOUNDARY = "_model_model_layers_1_Add_1_output_0"


def _bins(b: Path) -> list[Path]:
    return sorted(b.glob("*_part_*_of_*.bin"))


def _edit_json(p: Path, fn: Callable[[Any], None]) -> None:
    doc = json.loads(p.read_text())
    fn(doc)
    p.write_text(json.dumps(doc))


def _edit_config(b: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    _edit_json(b / "genie_config.json", fn)


def _edit_graphs(b: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    for p in _bins(b):
        _edit_json(p, lambda d: [fn(g) for g in d["graphs"]])


def missing_version(b: Path) -> None:
    _edit_config(b, lambda c: c["dialog"]["engine"]["backend"].pop("version"))


def unknown_key(b: Path) -> None:
    _edit_config(b, lambda c: c["dialog"]["context"].update({"n-ctx": 512}))


def renamed_input(b: Path) -> None:
    def fn(g: dict[str, Any]) -> None:
        g["inputs"] = {("position_ids" if k == "position_ids_sin" else k): v for k, v in g["inputs"].items()}

    _edit_graphs(b, fn)


def untied_kv(b: Path) -> None:
    def fn(g: dict[str, Any]) -> None:
        if g["name"].startswith("token_") and "past_key_0_in" in g["inputs"]:
            q = g["inputs"]["past_key_0_in"]["quantization_parameters"]
            q["scale"] = q["scale"] * 1.5

    _edit_graphs(b, fn)


def two_boundary_names(b: Path) -> None:
    def fn(g: dict[str, Any]) -> None:
        if BOUNDARY in g["inputs"]:
            g["inputs"] = {("hidden_states_in" if k == BOUNDARY else k): v for k, v in g["inputs"].items()}

    _edit_graphs(b, fn)


def rope_factor(b: Path) -> None:
    def fn(c: dict[str, Any]) -> None:
        c["dialog"]["engine"]["model"]["positional-encoding"]["rope-scaling"] = {
            "rope-type": "llama3",
            "factor": 8.0,
            "low-freq-factor": 1.0,
            "high-freq-factor": 4.0,
            "original-max-position-embeddings": 8192,
        }

    _edit_config(b, fn)


FAULTS = {
    "missing version": (
        missing_version,
        ["Missing backend field: version", "Failed to create the dialog config."],
    ),
    "unknown config key": (
        unknown_key,
        ["Unknown context config key: n-ctx", "Failed to create the dialog config."],
    ),
    "renamed graph input": (
        renamed_input,
        ["Tensor not found: position_ids_sin", "Failed to create the dialog."],
    ),
    "untied KV encoding": (
        untied_kv,
        [
            "Non-identical quantization parameters found for the same tensor",
            "Error validating HTP models",
            "Failed to create the dialog.",
        ],
    ),
    "part boundary with two names": (
        two_boundary_names,
        ["hidden_states_in", "compute wrong output", "Failed to create the dialog."],
    ),
}


@pytest.fixture()
def bundle(compiled_sim_run: Path, tmp_path: Path) -> Path:
    b = tmp_path / "bundle"
    shutil.copytree(compiled_sim_run / "artifacts" / "compile" / "bundle", b)
    return b


def _t2t(b: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sim_t2t_argv("Hello", 4),
        cwd=b,
        capture_output=True,
        text=True,
        timeout=180,
        env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def test_the_clean_simulation_bundle_runs_and_passes_bundle_check(bundle: Path) -> None:
    assert errors(check_bundle(bundle)) == []
    out = _t2t(bundle)
    assert out.returncode == 0, out.stderr
    assert "[BEGIN]:" in out.stdout and "[END]" in out.stdout


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_contract_fault_is_refused_by_the_simulator_and_bundle_check(bundle: Path, fault: str) -> None:
    make, words = FAULTS[fault]
    make(bundle)
    out = _t2t(bundle)
    assert out.returncode == 1, out.stdout
    assert "[BEGIN]" not in out.stdout  # nothing ran
    for w in words:
        assert w in out.stderr, (w, out.stderr)
    assert out.stderr.strip().splitlines()[-1].startswith("Failed to create the dialog")
    found = errors(check_bundle(bundle))
    assert found, f"bundle check passed a bundle with: {fault}"


def test_a_rope_genie_loads_runs_and_bundle_check_warns(bundle: Path) -> None:
    """A rope factor that differs from config.json (as Qualcomm's own Llama 3.2 bundles write it) is loaded by
    Genie: the simulator runs it too, and bundle check warns with the measured drift instead of refusing."""
    rope_factor(bundle)
    out = _t2t(bundle)
    assert out.returncode == 0 and "[BEGIN]:" in out.stdout, out.stderr
    found = check_bundle(bundle)
    assert errors(found) == [] and any(f.code == "rope_differs" for f in found)
