"""Every path genie_config.json names (issue 27 #3): ctx-bins, tokenizer, backend extensions, LoRA bin-sections,
a draft model's engine. A path outside the bundle, a symlink out of it, a FIFO or a device is refused by
`hexstudio bundle check`, by the push (before anything is sent) and by the board helper (before Genie loads
anything), with the entry and the rule named, and nothing hangs: a FIFO is never opened for reading."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device.errors import UnsafeBundle
from hexstudio.core.device.verify import load_bundle
from hexstudio.shared.bundle import safepath
from hexstudio.shared.bundle.check import check_bundle
from tests.support.board_helpers import board_python, push_helper
from tests.support.cli import python_m_hexstudio

REPO = Path(__file__).resolve().parents[2]

CONFIG: dict[str, Any] = {
    "dialog": {
        "version": 1,
        "type": "basic",
        "context": {"version": 1, "size": 256, "n-vocab": 840, "bos-token": 0, "eos-token": [1, 4]},
        "sampler": {"version": 1, "seed": 42, "temp": 0.0, "top-k": 1, "top-p": 1.0},
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
        "engine": {
            "version": 1,
            "n-threads": 1,
            "backend": {"version": 1, "type": "QnnHtp", "QnnHtp": {"version": 1}, "extensions": "ext.json"},
            "model": {
                "version": 1,
                "type": "binary",
                "binary": {"version": 1, "ctx-bins": ["m_part_1_of_2.bin", "m_part_2_of_2.bin"]},
            },
        },
    }
}


def _bundle(root: Path, change: Any = None) -> Path:
    b = root / "bundle"
    b.mkdir(parents=True)
    for name in ("tokenizer.json", "ext.json", "m_part_1_of_2.bin", "m_part_2_of_2.bin"):
        (b / name).write_bytes(b"{}")
    cfg = copy.deepcopy(CONFIG)
    if change is not None:
        change(cfg, b, root)
    (b / "genie_config.json").write_text(json.dumps(cfg))
    files = [
        {"path": p.name, "sha256": "0" * 64, "size": p.stat().st_size}
        for p in sorted(b.iterdir())
        if p.is_file() and not p.is_symlink()
    ]
    (b / "bundle.json").write_text(json.dumps({"bundle_version": 1, "files": files}))
    return b


def _bins(cfg: dict[str, Any]) -> list[str]:
    return list(cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"])


def _set_bin(value: str) -> Any:
    def change(cfg: dict[str, Any], b: Path, root: Path) -> None:
        cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"][1] = value

    return change


def _fifo_bin(cfg: dict[str, Any], b: Path, root: Path) -> None:
    os.mkfifo(b / "fifo_part_2_of_2.bin")
    cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"][1] = "fifo_part_2_of_2.bin"


def _symlink_out(cfg: dict[str, Any], b: Path, root: Path) -> None:
    (root / "secret.txt").write_text("secret")
    (b / "tok_link.json").symlink_to(root / "secret.txt")
    cfg["dialog"]["tokenizer"]["path"] = "tok_link.json"


def _device_ext(cfg: dict[str, Any], b: Path, root: Path) -> None:
    (b / "zero.json").symlink_to("/dev/zero")
    cfg["dialog"]["engine"]["backend"]["extensions"] = "zero.json"


def _lora_out(cfg: dict[str, Any], b: Path, root: Path) -> None:
    cfg["dialog"]["engine"]["model"]["binary"]["lora"] = {
        "version": 1,
        "adapters": [{"version": 1, "name": "a", "bin-sections": ["../../etc/passwd"]}],
    }


def _draft_out(cfg: dict[str, Any], b: Path, root: Path) -> None:
    target = copy.deepcopy(cfg["dialog"]["engine"])
    draft = copy.deepcopy(target)
    draft["model"]["binary"]["ctx-bins"] = ["/etc/passwd"]
    cfg["dialog"]["engine"] = [target, draft]


def _folder_bin(cfg: dict[str, Any], b: Path, root: Path) -> None:
    (b / "dir_part_2_of_2.bin").mkdir()
    cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"][1] = "dir_part_2_of_2.bin"


CRAFTED = [
    ("ctx-bin ../", _set_bin("../escape_part_2_of_2.bin"), "ctx-bins[1]", "climbs out"),
    ("ctx-bin absolute", _set_bin("/etc/passwd"), "ctx-bins[1]", "absolute"),
    ("ctx-bin a FIFO", _fifo_bin, "ctx-bins[1]", "FIFO"),
    ("ctx-bin a folder", _folder_bin, "ctx-bins[1]", "folder"),
    ("tokenizer symlinked out", _symlink_out, "tokenizer.path", "outside"),
    ("extensions a device", _device_ext, "extensions", "outside"),
    ("LoRA bin-sections ../", _lora_out, "bin-sections[0]", "climbs out"),
    ("draft engine absolute", _draft_out, "engine[1].model.binary.ctx-bins[0]", "absolute"),
]


@pytest.mark.parametrize(("what", "change", "entry", "rule"), CRAFTED, ids=[c[0] for c in CRAFTED])
def test_crafted_genie_config_refused_everywhere(
    tmp_path: Path, what: str, change: Any, entry: str, rule: str
) -> None:
    b = _bundle(tmp_path, change)
    # the studio's validator
    with pytest.raises(safepath.UnsafePath) as e:
        safepath.check_genie_config(json.loads((b / "genie_config.json").read_text()), b)
    assert entry in e.value.message and rule in e.value.message, e.value.message
    # `hexstudio bundle check`: a finding, never a hang (a real process, killed at 30 s)
    r = python_m_hexstudio("bundle", "check", str(b), timeout=30, cwd=REPO)
    assert r.returncode != 0 and entry in r.stdout + r.stderr and "Traceback" not in r.stderr, (
        r.stdout,
        r.stderr,
    )
    findings = check_bundle(b)
    assert any(f.code == "unsafe_path" for f in findings), findings
    # the push: refused before anything is sent
    with pytest.raises(UnsafeBundle) as pe:
        load_bundle(b)
    assert entry in str(pe.value)
    # the board helper (pushed, standard library only, as on the board): refused before libGenie is loaded
    helper = push_helper("genie_session", tmp_path / "bin")
    h = subprocess.run(
        board_python(helper, "--config", str(b / "genie_config.json"), "--lib", "/nonexistent/libGenie.so"),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=b,
        stdin=subprocess.DEVNULL,
    )
    events = [json.loads(ln) for ln in h.stdout.splitlines() if ln.startswith("{")]
    assert any(ev.get("code") == "unsafe_path" for ev in events), (h.stdout, h.stderr)
    assert "Traceback" not in h.stderr


def test_fifo_genie_config_and_bundle_json_do_not_hang(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    (b / "genie_config.json").unlink()
    os.mkfifo(b / "genie_config.json")
    r = python_m_hexstudio("bundle", "check", str(b), timeout=30, cwd=REPO)
    assert r.returncode != 0 and "FIFO" in r.stdout + r.stderr, (r.stdout, r.stderr)
    (b / "bundle.json").unlink()
    os.mkfifo(b / "bundle.json")
    with pytest.raises(UnsafeBundle) as e:
        load_bundle(b)
    assert "FIFO" in str(e.value)


def test_a_good_config_passes(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    safepath.check_genie_config(json.loads((b / "genie_config.json").read_text()), b)
    with safepath.open_regular(b, "tokenizer.json") as fh:
        assert fh.read() == b"{}"
    assert not any(f.code == "unsafe_path" for f in check_bundle(b))
