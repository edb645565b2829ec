"""Genie 1.21's own config parser (libGenie's GenieDialogConfig_createFromJson, run in a child process) against
HexStudio's schema checker, on every shipped and test genie_config.json and on the mistakes people make; and
`hexstudio bundle check` shows Genie's own words."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.qnn.conftest import needs_qnn
from tests.support.configs import LLAMA_31_8B

pytestmark = needs_qnn
REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "compile" / "fixtures" / "llama_v3_2_1b_instruct-genie-w4a16-qualcomm_qcs9075"


def _genie_parse(cfg: dict[str, Any]) -> dict[str, Any]:
    """Genie's parser in a child (as the studio runs it): status 0 = accepted; message = what Genie printed."""
    code = (
        "import json, sys; from hexstudio.workers.qnn.genie_check import genie_parse; from hexstudio.workers.qnn.libs import "
        "find_qnn_libs; print(json.dumps(genie_parse(sys.stdin.read(), find_qnn_libs().genie)))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(cfg),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def _configs() -> dict[str, dict[str, Any]]:
    from hexstudio.shared import bundle as gb
    from hexstudio.shared.data import builtin_model_dir

    hf_builtin = json.loads((builtin_model_dir() / "config.json").read_text())
    return {
        "qai-hub-models Llama 3.2 1B bundle (test fixture)": json.loads(
            (FIXTURE / "genie_config.json").read_text()
        ),
        "HexStudio, built-in model": gb.genie_config(
            hf_builtin, 512, ["m_part_1_of_2.bin", "m_part_2_of_2.bin"], 32
        ),
        "HexStudio, Llama 3.1 8B at 4096": gb.genie_config(
            LLAMA_31_8B, 4096, [f"m_part_{i}_of_5.bin" for i in range(1, 6)], 128
        ),
    }


def _mutations(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    c = copy.deepcopy(cfg)
    c["dialog"]["engine"]["model"]["positional-encodings"] = c["dialog"]["engine"]["model"].pop(
        "positional-encoding"
    )
    out["qai-hub-models 0.37's misspelled positional-encodings"] = c
    c = copy.deepcopy(cfg)
    del c["dialog"]["engine"]["backend"]["version"]
    out["a section without its version"] = c
    c = copy.deepcopy(cfg)
    c["dialog"]["context"]["bos-token"] = None
    out["bos-token null"] = c
    c = copy.deepcopy(cfg)
    c["dialog"]["engine"]["backend"]["QnnHtp"]["use-mmap"] = "true"
    out["a boolean written as text"] = c
    c = copy.deepcopy(cfg)
    del c["dialog"]["engine"]["n-threads"]
    out["a mandatory key left out"] = c
    return out


def test_genie_accepts_every_config_we_ship_and_our_checker_agrees() -> None:
    from hexstudio.shared.bundle.genie_schema import genie_config_errors

    for name, cfg in _configs().items():
        got = _genie_parse(cfg)
        assert got["status"] == 0, (name, got["message"])
        assert got["genie_version"] == "1.21.0"
        assert genie_config_errors(cfg) == [], name


def test_genie_refuses_the_mistakes_and_our_checker_refuses_them_too() -> None:
    from hexstudio.shared.bundle.genie_schema import genie_config_errors

    base = _configs()["HexStudio, built-in model"]
    for name, cfg in _mutations(base).items():
        got = _genie_parse(cfg)
        assert got["status"] != 0 and got["message"], name
        assert genie_config_errors(cfg), (
            f"Genie refuses '{name}' ({got['message'][:200]}) but HexStudio's checker passes it"
        )


def test_bundle_check_prints_genies_own_refusal(tmp_path: Path) -> None:
    b = tmp_path / "bundle"
    shutil.copytree(FIXTURE, b)
    cfg = json.loads((b / "genie_config.json").read_text())
    model = cfg["dialog"]["engine"]["model"]
    model["positional-encodings"] = model.pop("positional-encoding")
    (b / "genie_config.json").write_text(json.dumps(cfg, indent=2))
    p = subprocess.run(
        [sys.executable, "-m", "hexstudio", "bundle", "check", str(b), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    genie = next(f for f in doc["findings"] if f["code"] == "genie_parser")
    assert "validation failed for additional property 'positional-encodings'" in genie["genie_error"]
    assert "Genie 1.21.0" in genie["message"]


def test_a_stand_in_binary_is_refused_by_qnns_reader() -> None:
    """The fixture's .bin files are text stand-ins: QNN's reader says they are not context binaries."""
    from hexstudio.core.services.bundle_check import check

    found = check(FIXTURE)
    bad = [f for f in found if f.code == "ctx_bin_unreadable"]
    assert len(bad) == 3 and "QnnSystemContext_getBinaryInfo" in bad[0].message
