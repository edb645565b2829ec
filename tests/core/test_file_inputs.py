"""A file setting's contents are its input (the quantize/validate review): calibration_text and validation_text
name a file, and only the name was hashed, so after the file was edited Quantize and Validate stayed current and a
resumed run kept encodings and a gate verdict made from the old text."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hexstudio.core.runs import Workspace
from hexstudio.core.stage_state import display_state
from tests.support.gate_runs import PASSING, finish_stage


def test_editing_the_calibration_or_validation_text_makes_its_stage_stale(tmp_path: Path) -> None:
    cal, val = tmp_path / "cal.txt", tmp_path / "val.txt"
    cal.write_text("the text the model is calibrated on\n" * 50)
    val.write_text("the text it is validated on\n" * 50)
    m = Workspace(tmp_path / "ws").create_run(
        "builtin:tiny-llama", "sim", {"calibration_text": str(cal), "validation_text": str(val)}
    )
    for name in ("model", "preflight", "quantize", "validate"):
        finish_stage(m, name, PASSING[name])

    def states() -> tuple[str, str]:
        return display_state(m, "quantize"), display_state(m, "validate")

    assert states() == ("done", "done")
    cal.write_text("another text altogether\n" * 50)
    assert states()[0] == "stale"
    # the same words written again (a newer mtime): what counts is what the file holds
    cal.write_text("the text the model is calibrated on\n" * 50)
    os.utime(cal, ns=(cal.stat().st_atime_ns, cal.stat().st_mtime_ns + 10**9))
    assert states() == ("done", "done")
    val.write_text("edited\n" * 50)
    assert states() == ("done", "stale")
    val.unlink()
    assert states() == ("done", "stale")  # gone: not the text it was judged on


def test_a_run_on_the_built_in_texts_keeps_its_hash() -> None:
    """Runs made before (every run on "builtin", a self-drafting spd) keep their stages current: nothing is added
    for them."""
    from hexstudio.core.stage_state import _file_digest

    assert _file_digest("builtin") is None and _file_digest("") is None and _file_digest(None) is None
    assert _file_digest("self") is None


def test_a_draft_compiled_again_makes_the_targets_compile_stale(tmp_path: Path) -> None:
    """spd_draft names the draft model's bundle folder, whose context binaries Compile copies into the target's
    bundle (draft/): only the path was hashed, so a draft compiled again left the target's bundle on the old
    draft's binaries, current. Its bundle.json (a sha256 for every file) is now the input."""
    draft = tmp_path / "draft-run" / "artifacts" / "compile" / "bundle"
    draft.mkdir(parents=True)
    (draft / "bundle.json").write_text('{"files": {"draft_part_1_of_1.bin": "aa"}}')
    m = Workspace(tmp_path / "ws").create_run(
        "builtin:tiny-llama",
        "sim",
        {"speculative_dialogs": "spd", "spd_draft": str(draft), "compile_target": "local", "ar_sizes": "4"},
    )
    for name in ("model", "preflight", "quantize", "validate", "compile"):
        finish_stage(m, name, PASSING[name])
    assert display_state(m, "compile") == "done"
    (draft / "bundle.json").write_text('{"files": {"draft_part_1_of_1.bin": "bb"}}')
    assert display_state(m, "compile") == "stale"
    (draft / "bundle.json").unlink()
    assert display_state(m, "compile") == "stale"  # gone: not the draft the bundle holds


def test_a_setting_change_that_makes_a_combination_compile_refuses_is_refused(tmp_path: Path) -> None:
    """change_settings (the studio's pages, `run --resume --set`) checked each value alone: ar_n 8 on a lade run
    was recorded, though a run made so is refused (lade's 16-token step on AR-8), and Compile refused it after
    hours of quantizing."""
    import pytest

    from hexstudio.core.runs import change_settings
    from hexstudio.shared.run_settings import BadSettings

    m = Workspace(tmp_path / "ws").create_run("builtin:tiny-llama", "sim", {"speculative_dialogs": "lade"})
    events = len(m.data["events"])
    with pytest.raises(BadSettings) as err:
        change_settings(m, {"ar_n": 8}, "the setting AR-N")
    assert "lade" in err.value.message and "AR-8" in err.value.message
    with pytest.raises(BadSettings, match="context"):
        change_settings(m, {"context_length": 128}, "the setting context length")
    assert m.settings["ar_n"] == 128 and len(m.data["events"]) == events
    assert change_settings(m, {"ar_n": 64}, "the setting AR-N") == ["ar_n"]  # a 16-token step fits AR-64


def test_an_edited_suite_of_the_users_makes_evaluate_stale(tmp_path: Path) -> None:
    """A suite added to the workspace (`hexstudio eval add`, again with --replace after fixing a case) was read only
    by name: Evaluate stayed current and a resumed run kept the scores of the old cases. Its contents count now;
    the shipped suites add nothing, so runs on them keep their hash."""
    from hexstudio.core.eval.suites import user_dir

    ws = tmp_path / "ws"
    mine = user_dir(ws) / "mine.jsonl"
    mine.parent.mkdir(parents=True)
    mine.write_text('{"id": "a", "prompt": "hi", "scorer": "exact", "expected": {"answer": "hi"}}\n')
    m = Workspace(ws).create_run("builtin:tiny-llama", "sim", {"eval_suites": ["mine", "tool_calling"]})
    shipped_only = Workspace(ws).create_run("builtin:tiny-llama", "sim")
    for run in (m, shipped_only):
        for name in PASSING:
            finish_stage(run, name, PASSING[name])
            if name == "evaluate":
                break
    assert display_state(m, "evaluate") == display_state(shipped_only, "evaluate") == "done"
    mine.write_text('{"id": "a", "prompt": "hello", "scorer": "exact", "expected": {"answer": "hello"}}\n')
    assert display_state(m, "evaluate") == "stale"
    assert display_state(shipped_only, "evaluate") == "done"


def test_a_relative_file_setting_names_the_same_file_from_anywhere(tmp_path: Path, monkeypatch: Any) -> None:
    """`--set calibration_text=cal.txt` was stored as given: resumed from another folder (the studio, another
    shell) it named another file or none, so Quantize went stale (its input hash read "missing") and ran again
    for hours, then failed. A file setting is stored as an absolute path, when the run is made and when changed."""
    from hexstudio.core.runs import change_settings

    data = tmp_path / "data"
    data.mkdir()
    (data / "cal.txt").write_text("the text the model is calibrated on\n" * 50)
    (data / "val.txt").write_text("the text it is validated on\n" * 50)
    monkeypatch.chdir(data)
    m = Workspace(tmp_path / "ws").create_run("builtin:tiny-llama", "sim", {"calibration_text": "cal.txt"})
    assert m.settings["calibration_text"] == str(data / "cal.txt")
    assert (
        m.settings["validation_text"] == "builtin" and m.settings.get("spd_draft", "self") == "self"
    )  # no paths
    for name in ("model", "preflight", "quantize"):
        finish_stage(m, name, PASSING[name])
    change_settings(m, {"validation_text": "val.txt"}, "test")
    assert m.settings["validation_text"] == str(data / "val.txt")
    monkeypatch.chdir(tmp_path)  # resumed from elsewhere
    assert display_state(m, "quantize") == "done"
