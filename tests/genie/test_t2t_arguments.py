"""The simulator board's genie-t2t-run checks its command line the same way whichever runner answers: a bundle
of real context binaries went to Qualcomm's libGenie before any check, so a missing prompt was a TypeError
traceback (not Genie's "Please provide prompt" line the explain rules know), and PAUSE or a stray --sleep were
ignored silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexstudio.workers.genie_sim import t2t


@pytest.fixture
def real_bundle(tmp_path: Path) -> Path:
    """A genie_config.json whose first ctx-bin is not the twin's format (a real context binary, as far as the
    runner can tell): t2t hands such a bundle to Qualcomm's libGenie."""
    (tmp_path / "model_part_1_of_1.bin").write_bytes(b"\x00QNN context binary" * 64)
    cfg = {"dialog": {"engine": {"model": {"binary": {"ctx-bins": ["model_part_1_of_1.bin"]}}}}}
    (tmp_path / "genie_config.json").write_text(json.dumps(cfg))
    return tmp_path / "genie_config.json"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([], "Please provide prompt using --prompt or --prompt_file"),
        (["-p", "hi", "--prompt_file", "x.txt"], "only one of --prompt or --prompt_file"),
        (["--prompt_file", "/nowhere/prompt.txt"], "Cannot read the prompt file /nowhere/prompt.txt"),
        (["-p", "hi", "--action", "PAUSE", "--sleep", "10"], "--action PAUSE"),
        (["-p", "hi", "--sleep", "10"], "give --action ABORT with it"),
    ],
)
def test_a_bad_command_line_is_refused_before_the_real_runner(
    real_bundle: Path,
    argv: list[str],
    said: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert t2t.holds_real_binaries(str(real_bundle))

    def real_runner(_argv: list[str] | None = None) -> int:
        raise AssertionError("Qualcomm's runner got a command line genie-t2t-run refuses")

    monkeypatch.setattr("hexstudio.workers.qnn.genie_t2t.main", real_runner)
    assert t2t.main(["-c", str(real_bundle), *argv]) == 1
    assert said in capsys.readouterr().err
