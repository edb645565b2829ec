"""The issue's acceptance: `hexstudio run --until preflight` on the built-in model, schema-valid run.json."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from hexstudio.core.manifest import validate_manifest
from hexstudio.core.status import KINDS
from tests.support.cli import RUN_BUILTIN, hexstudio


def _hexstudio(*args: str) -> subprocess.CompletedProcess[str]:
    return hexstudio(*args, timeout=300)


def test_run_until_preflight_makes_a_valid_run(tmp_path: Path) -> None:
    proc = _hexstudio(*RUN_BUILTIN, "--until", "preflight", "--workspace", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] and out["ran"] == ["model", "preflight"]
    data = json.loads((Path(out["run_dir"]) / "run.json").read_text())
    validate_manifest(data)
    assert data["stages"]["model"]["metrics"]["num_parameters"]["value"] > 3_000_000
    assert data["stages"]["preflight"]["metrics"]["checks_failed"]["value"] == 0
    assert data["stages"]["quantize"]["state"] == "pending"
    assert data["stages"]["preflight"]["peak_rss_bytes"] > 0
    # issue 32: the statuses `run --json` prints are the one status model's (hexstudio/core/status.py), the same as
    # `runs show --json` and `runs list --json` print
    words = {k.key: k.word for k in KINDS.values()}
    assert {s["key"] for s in out["statuses"].values()} <= set(words)
    assert all(s["word"] == words[s["key"]] for s in out["statuses"].values())
    assert out["statuses"]["model"]["word"] == "passed" and out["statuses"]["preflight"]["word"] == "passed"
    assert out["statuses"]["quantize"]["key"] == "pending"
    assert out["run_status"]["key"] == "in_progress" and out["run_status"]["word"].startswith("2/")
    show = _hexstudio("runs", "show", out["run_id"], "--workspace", str(tmp_path), "--json")
    shown = json.loads(show.stdout)
    assert shown["statuses"] == out["statuses"] and shown["run_status"] == out["run_status"]
    listed = _hexstudio("runs", "list", "--workspace", str(tmp_path), "--json")
    assert json.loads(listed.stdout)["runs"][0]["run_status"] == out["run_status"]
    # resume: nothing to do, both skipped
    again = _hexstudio(
        "run", "--resume", out["run_id"], "--until", "preflight", "--workspace", str(tmp_path), "--json"
    )
    assert json.loads(again.stdout)["skipped"] == ["model", "preflight"]


def test_only_and_until_together_are_refused_and_quiet_says_only_the_outcome(tmp_path: Path) -> None:
    """`--until compile --only validate` ran validate alone and said nothing of --until; --quiet ("print only the
    outcome") still printed the table of stages."""
    both = _hexstudio(*RUN_BUILTIN, "--until", "compile", "--only", "model", "--workspace", str(tmp_path))
    assert both.returncode == 2 and "not allowed with argument" in both.stderr, both.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run made
    quiet = _hexstudio(*RUN_BUILTIN, "--only", "model", "--workspace", str(tmp_path), "--quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.startswith("ok: ") and "peak RSS" not in quiet.stderr, (quiet.stdout, quiet.stderr)


def test_preflight_measures_again_after_a_failed_gate_for_the_settings_and_machine_of_now(
    tmp_path: Path,
) -> None:
    """Preflight measures the machine. A failed gate stayed failed on resume though the person fixed what it found
    (its inputs were the same, so it was skipped as current); a pass recorded on a worker host stayed valid back
    on this machine; and changed calibration settings were checked against the Model stage's old estimate."""
    import asyncio

    from hexstudio.core.manifest import RunManifest
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.stage_state import stage_is_current
    from hexstudio.core.stages import get_stage

    proc = _hexstudio(*RUN_BUILTIN, "--until", "preflight", "--workspace", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(json.loads(proc.stdout)["run_dir"])
    m = RunManifest.load(run_dir)
    # the gate failed last time (too little memory, say); the person added swap since
    st = m.stage("preflight").data
    st["metrics"]["checks_failed"] = {"value": 2}
    st["gate"] = {"passed": False, "reason": "2 preflight check(s) failed", "override": None}
    m.save()
    res = asyncio.run(Pipeline(m).run(until="preflight"))
    assert res.ok and res.ran == ["preflight"] and res.skipped == ["model"], res
    assert any("Preflight runs again: its gate failed last time" in e["message"] for e in m.data["events"])
    # a passed gate is not measured again
    again = asyncio.run(Pipeline(RunManifest.load(run_dir)).run(until="preflight"))
    assert again.skipped == ["model", "preflight"]
    # another machine is another measurement, and so is this one again after it
    preflight = get_stage("preflight")
    m = RunManifest.load(run_dir)
    assert stage_is_current(m, preflight)
    m.settings["worker_host"] = "bigbox"
    assert not stage_is_current(m, preflight)
    m.settings["worker_host"] = None
    assert stage_is_current(m, preflight)  # as it was measured: on this machine
    # calibration settings are Preflight's inputs, not the Model stage's: the needs are computed for them now
    m.settings["calibration_samples"] = 12
    m.save()
    res = asyncio.run(Pipeline(m).run(until="preflight"))
    assert res.ran == ["preflight"] and res.skipped == ["model"], res


def test_preflight_checks_the_needs_of_the_calibration_settings_of_now() -> None:
    """The Model stage's estimate is for the calibration settings it ran with; Preflight reran after they changed,
    but checked the old figure: at 8B shapes 8 x 128 tokens need 6.6 GiB to quantize, 1000 x 128 need 15 GiB."""
    from hexstudio.shared import modelinfo
    from hexstudio.shared.run_settings import RunSettings
    from hexstudio.workers.preflight import needs_now

    cfg = json.loads(
        (
            Path(__file__).parents[2] / "bench" / "configs" / "Llama-3.1-8B-Instruct" / "config.json"
        ).read_text()
    )
    info = modelinfo.inspect_config(cfg)
    at_8 = needs_now({"info": info, "source": "huggingface"}, RunSettings(calibration_samples=8), None)
    at_1000 = needs_now({"info": info, "source": "huggingface"}, RunSettings(calibration_samples=1000), None)
    assert at_1000["quantize_peak_rss_bytes"] > at_8["quantize_peak_rss_bytes"] + 4 * 2**30


def test_resume_with_set_changes_the_setting_the_failure_named(tmp_path: Path) -> None:
    """A run made with a setting the Model stage refuses said "resume with: hexstudio run --resume ID", and
    --set was refused on resume: the run could not be mended from the terminal (the studio's pages change a
    run's settings)."""
    bad = _hexstudio(
        *RUN_BUILTIN,
        "--set",
        "context_lengths=1024",
        "--until",
        "model",
        "--workspace",
        str(tmp_path),
        "--json",
    )
    out = json.loads(bad.stdout)
    assert bad.returncode != 0 and out["stopped_at"] == "model", bad.stdout
    fixed = _hexstudio(
        "run", "--resume", out["run_id"], "--set", "context_lengths=384", "--until", "model",
        "--workspace", str(tmp_path), "--json",
    )  # fmt: skip
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    run = json.loads((Path(out["run_dir"]) / "run.json").read_text())
    assert run["inputs"]["settings"]["context_lengths"] in ([384], "384")
    assert any(e["kind"] == "setting_changed" and "context_lengths" in e["message"] for e in run["events"])
    again = _hexstudio("run", "--resume", out["run_id"], "--model", "x/y", "--workspace", str(tmp_path))
    assert again.returncode != 0 and "--model, --revision and --board cannot change them" in again.stderr
    # --set goes no further: the revision is the model's input, and a worker host must exist
    for item, says in (("revision=v2", "cannot change it"), ("worker_host=nobox", "nobox")):
        r = _hexstudio("run", "--resume", out["run_id"], "--set", item, "--workspace", str(tmp_path))
        assert r.returncode != 0 and says in r.stderr, (item, r.stderr)
    run = json.loads((Path(out["run_dir"]) / "run.json").read_text())
    assert "revision" not in run["inputs"]["settings"] or run["inputs"]["settings"]["revision"] in (None, "")
    assert not run["inputs"]["settings"].get("worker_host")
