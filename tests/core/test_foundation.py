"""Protocol, manifest schema, atomic writes, settings migrations, secrets, CLI."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hexstudio.core import secrets
from hexstudio.core.atomic import atomic_writer, write_json_atomic
from hexstudio.core.manifest import ManifestError, RunManifest, validate_manifest
from hexstudio.core.runs import RunNotFound, Workspace
from hexstudio.core.settings import SETTINGS_VERSION, Settings, SettingsError
from hexstudio.shared.protocol import Emitter, ProtocolError, event_json_schema, parse_event

REPO = Path(__file__).resolve().parents[2]


def test_emitted_events_parse_and_match_the_published_schema() -> None:
    buf = io.StringIO()
    em = Emitter(buf)
    em.progress(0.25, "calibrating part 1/5", part=1, parts=5)
    em.log("hello", level="warn")
    em.metric("top1_agreement", 0.97, unit="")
    em.artifact("parts/x.onnx", kind="onnx")
    em.warning("low disk", hint="free 20 GB")
    em.error("oom", "out of memory", "use more parts")
    em.done(False)
    schema = event_json_schema()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 7
    for line in lines:
        ev = parse_event(line)
        jsonschema.validate(ev, schema)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "hello",
        "[1,2]",
        '{"v": 2, "type": "log", "message": "x"}',
        '{"v": 1, "type": "nope"}',
        '{"v": 1, "type": "progress", "fraction": 1.5, "message": ""}',
        '{"v": 1, "type": "progress", "fraction": true, "message": ""}',
        '{"v": 1, "type": "error", "message": "no code"}',
        b"\xff\xfe",
    ],
)
def test_bad_protocol_lines_are_rejected(line: str | bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_event(line)


def test_atomic_writer_keeps_old_content_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    write_json_atomic(target, {"a": 1})
    with pytest.raises(RuntimeError), atomic_writer(target) as fh:
        fh.write('{"half": ')
        raise RuntimeError("crash mid-write")
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temp file left


def test_atomic_writes_get_the_mode_open_would_give(tmp_path: Path) -> None:
    """mkstemp makes its file 0600, and the rename kept it: a report the user exported, and every file written
    this way, could be read by its owner alone."""
    from hexstudio.core.atomic import write_text_atomic

    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "report.html", "<html/>")
        assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o644
        (tmp_path / "report.html").chmod(0o640)  # a file replaced keeps its mode
        write_text_atomic(tmp_path / "report.html", "<html>2</html>")
        assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o640
        write_text_atomic(tmp_path / "chat.json", "{}", private=True)  # the user's own words
        assert stat.S_IMODE((tmp_path / "chat.json").stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_new_run_validates_and_corrupt_manifest_is_explained(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    m = ws.create_run("builtin:tiny-llama", "sim")
    validate_manifest(json.loads(m.path.read_text()))
    assert not any(p.name.startswith(".") for p in ws.runs_dir.iterdir())
    m.path.write_text("{ truncated")
    with pytest.raises(ManifestError, match="cannot be read"):
        RunManifest.load(m.run_dir)
    with pytest.raises(RunNotFound, match="runs list"):
        ws.open_run("20990101-000000-nope-0000")
    with pytest.raises(RunNotFound):
        ws.run_dir("../../etc")


def test_delete_run_removes_everything(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    m = ws.create_run("builtin:tiny-llama", "sim")
    ws.delete_run(m.run_id)
    assert ws.list_runs() == []
    assert list(ws.runs_dir.iterdir()) == []


def test_no_runner_takes_a_run_between_the_delete_check_and_the_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delete_run let go of the run's lock before it moved the folder away: a `run --resume` starting in
    that gap ran its stage in a folder being deleted."""
    from hexstudio.core.runs import RunBusy, RunLock

    ws = Workspace(tmp_path)
    m = ws.create_run("builtin:tiny-llama", "sim")
    rename = Path.rename
    taken: list[str] = []

    def racing_rename(self: Path, target: Any) -> Any:
        if self == m.run_dir:  # another process tries to take the run just before the folder goes
            try:
                RunLock(m.run_dir).acquire()
                taken.append("runner got the run")
            except RunBusy:
                taken.append("busy")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", racing_rename)
    ws.delete_run(m.run_id)
    assert taken == ["busy"] and not m.run_dir.exists()


@pytest.mark.parametrize(
    "damage",
    [
        b"[]",
        b'{"schema_version": 1, "stages": []}',
        b'{"schema_version": 1, "inputs": "x", "stages": {}}',
        b"\xff\xfe",
        b"{bad",
    ],
)
def test_one_damaged_run_json_neither_breaks_nor_hides_from_the_list(tmp_path: Path, damage: bytes) -> None:
    """A run.json of the right JSON but the wrong shape broke `runs list` for the whole workspace ("a HexStudio
    bug"); one that was not JSON vanished from the list without a word."""
    from hexstudio.core.manifest import ManifestError
    from tests.support.cli import python_m_hexstudio

    ws = Workspace(tmp_path / "ws")
    good = ws.create_run("builtin:tiny-llama", "sim")
    bad = ws.create_run("builtin:tiny-llama", "sim")
    (bad.run_dir / "run.json").write_bytes(damage)
    assert {r.run_id for r in ws.list_runs()} == {good.run_id, bad.run_id}
    with pytest.raises(ManifestError, match=r"damaged|cannot be read|schema_version"):
        ws.open_run(bad.run_id)
    r = python_m_hexstudio("runs", "list", "--workspace", str(tmp_path / "ws"))
    assert r.returncode == 0 and "HexStudio bug" not in r.stderr, r.stderr
    assert good.run_id in r.stdout and bad.run_id in r.stdout and "unreadable run.json" in r.stdout


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda d: d["inputs"].pop("model"), '"inputs.model" is None'),
        (lambda d: d.pop("run_id"), '"run_id" is None'),
        (lambda d: d["stages"]["model"].update(duration_s="x"), "duration_s 'x', not a number"),
    ],
    ids=["no model", "no run_id", "duration text"],
)
def test_a_hand_edited_run_json_is_said_to_be_damaged(tmp_path: Path, edit: Any, words: str) -> None:
    """`runs show` on a run.json without inputs.model or run_id, or with duration_s "x", failed as "a HexStudio
    bug" (KeyError, a format code error) instead of saying what is wrong with the file."""
    from tests.support.cli import python_m_hexstudio

    ws = Workspace(tmp_path / "ws")
    m = ws.create_run("builtin:tiny-llama", "sim")
    doc = json.loads((m.run_dir / "run.json").read_text())
    edit(doc)
    (m.run_dir / "run.json").write_text(json.dumps(doc))
    r = python_m_hexstudio("runs", "show", m.run_id, "--workspace", str(tmp_path / "ws"))
    assert r.returncode == 1 and "HexStudio bug" not in r.stderr, r.stderr
    assert "is damaged" in r.stderr and words in r.stderr and f"runs delete {m.run_id}" in r.stderr, r.stderr


def test_a_running_stage_whose_owner_pid_is_text_is_interrupted_not_unreadable(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    m = ws.create_run("builtin:tiny-llama", "sim")
    import socket

    from hexstudio.core.manifest import boot_id

    owner = {"pid": "abc", "host": socket.gethostname(), "boot_id": boot_id()}  # this machine, this boot
    m.stage("model").data.update(state="running", owner=owner)
    m.save()
    assert ws.open_run(m.run_id).stage("model").state == "interrupted"  # int("abc") raised here


def test_a_settings_section_written_as_null_is_empty_not_a_crash(tmp_path: Path) -> None:
    """`"boards": null` passed the shape check, then `hexstudio board list` and the studio's start failed on
    None; a v1 file with `"aihub": null` beside `aihub_url` failed in the migration."""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"settings_version": 2, "boards": None, "worker_hosts": None}))
    s = Settings.load(path)
    assert s.boards == {} and (s.data.get("worker_hosts") or {}) == {}
    path.write_text(json.dumps({"settings_version": 1, "aihub": None, "aihub_url": "https://hub.invalid"}))
    assert Settings.load(path).run_defaults()["aihub_api_url"] == "https://hub.invalid"


def test_settings_migrate_from_v0_and_keep_a_backup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "settings.json"
    path.write_text(
        json.dumps(
            {
                "boards": [{"name": "evk", "host": "10.0.0.5", "user": "ubuntu"}],
                "aihub_url": "https://example.invalid",
            }
        )
    )
    s = Settings.load(path)
    assert s.data["settings_version"] == SETTINGS_VERSION
    assert s.boards == {"evk": {"host": "10.0.0.5", "user": "ubuntu"}}
    # v2 moved the address to an "aihub" section nothing read; v3 makes it the run setting the Compile stage reads
    assert s.run_defaults()["aihub_api_url"] == "https://example.invalid" and "aihub" not in s.data
    assert s.run_defaults()["aihub_web_url"] == "https://example.invalid"
    assert (tmp_path / "settings.json.v0.bak").exists()
    # an address in use from the environment: the stale one of the settings file must not outrank it
    path.write_text(json.dumps({"settings_version": 2, "aihub": {"api_url": "https://old.invalid"}}))
    monkeypatch.setenv("HEXSTUDIO_AIHUB_API_URL", "https://env.invalid")
    assert "aihub_api_url" not in (Settings.load(path).data.get("run_defaults") or {})
    monkeypatch.delenv("HEXSTUDIO_AIHUB_API_URL")
    # Qualcomm's own address (v2's default) is what an unset run setting means already: nothing is added
    public = {"api_url": "https://app.aihub.qualcomm.com", "web_url": "https://app.aihub.qualcomm.com/"}
    path.write_text(json.dumps({"settings_version": 2, "aihub": public, "run_defaults": {"parts": 4}}))
    assert Settings.load(path).data["run_defaults"] == {"parts": 4}
    assert json.loads(path.read_text())["settings_version"] == SETTINGS_VERSION
    path.write_text(json.dumps({"settings_version": SETTINGS_VERSION + 1}))
    with pytest.raises(SettingsError, match="newer HexStudio"):
        Settings.load(path)


def test_secrets_use_the_test_keyring_not_the_system_one() -> None:
    import keyring

    assert type(keyring.get_keyring()).__name__ == "PlaintextKeyring"
    secrets.set_secret(secrets.AIHUB_TOKEN, "canary-token-123")
    assert secrets.get_secret(secrets.AIHUB_TOKEN) == "canary-token-123"
    assert "canary-token-123" in secrets.known_secret_values()
    secrets.delete_secret(secrets.AIHUB_TOKEN)
    assert secrets.get_secret(secrets.AIHUB_TOKEN) is None


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("hexstudio")
    return subprocess.run(
        [str(exe), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


def test_cli_runs_list_show_json(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    m = ws.create_run("builtin:tiny-llama", "sim")
    out = _cli("runs", "list", "--json", "--workspace", str(tmp_path))
    assert out.returncode == 0, out.stderr
    runs = json.loads(out.stdout)["runs"]
    assert [r["run_id"] for r in runs] == [m.run_id]
    show = _cli("runs", "show", m.run_id, "--json", "--workspace", str(tmp_path))
    data = json.loads(show.stdout)
    assert data["run_id"] == m.run_id and data["display_states"]["model"] == "pending"
    missing = _cli("runs", "show", "nope-1", "--workspace", str(tmp_path))
    assert missing.returncode == 1 and "runs list" in missing.stderr


def test_worker_dispatch_refuses_unknown_workers(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text("{}")
    a = _cli("--worker", "no_such_stage", "--spec", str(spec))
    assert a.returncode == 2 and "there is no worker 'no_such_stage'" in a.stderr
    b = _cli("--worker", "../etc", "--spec", str(spec))
    assert b.returncode == 2 and "not a worker name" in b.stderr


def test_secrets_reach_workers_by_environment_only(tmp_path: Path) -> None:
    """A canary token in the keyring reaches the worker's environment but never the spec, log or run.json."""
    import asyncio
    import dataclasses

    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.stage_api import worker_env
    from tests.core.conftest import fake_stages

    secrets.set_secret(secrets.HF_TOKEN, "hf_canary_4242")
    try:
        assert worker_env().get("HF_TOKEN") == "hf_canary_4242"
        st = dataclasses.replace(fake_stages(("model",))[0])
        m = Workspace(tmp_path).create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
        assert asyncio.run(Pipeline(m, stages=(st,)).run(until="model")).ok
        for p in m.run_dir.rglob("*"):
            if p.is_file():
                assert b"hf_canary_4242" not in p.read_bytes(), p
    finally:
        secrets.delete_secret(secrets.HF_TOKEN)


def test_opening_a_run_marks_a_dead_stage_interrupted_but_writes_only_under_its_lock(tmp_path: Path) -> None:
    """`runs list`, `runs show` and the studio open every run; one that found a stage left "running" by a dead
    process saved its copy without the lock, over a runner's newer run.json."""
    import socket

    from hexstudio.core.manifest import boot_id
    from hexstudio.core.runs import RunLock

    ws = Workspace(tmp_path / "ws")
    m = ws.create_run("builtin:tiny-llama", "sim")
    dead = {"pid": 2**22 + 7, "host": socket.gethostname(), "boot_id": boot_id()}  # on this machine, gone
    m.stage("model").data.update(state="running", owner=dead)
    m.save()
    on_disk = (m.run_dir / "run.json").read_bytes()
    with RunLock(m.run_dir):  # a runner holds the run
        seen = ws.open_run(m.run_id)
        assert seen.stage("model").state == "interrupted"  # what the reader shows
        assert (m.run_dir / "run.json").read_bytes() == on_disk  # the runner's file untouched
    assert ws.open_run(m.run_id).stage("model").state == "interrupted"
    assert json.loads((m.run_dir / "run.json").read_text())["stages"]["model"]["state"] == "interrupted"


def test_a_running_stage_of_this_very_process_without_its_lock_is_interrupted(tmp_path: Path) -> None:
    """A stage whose end could not be written (a full disk) stayed "running" on disk under the studio's own pid:
    the studio showed it working until it restarted. Without the run's lock no pipeline of this process runs it."""
    import os
    import socket

    from hexstudio.core.manifest import boot_id
    from hexstudio.core.runs import RunLock

    ws = Workspace(tmp_path / "ws")
    m = ws.create_run("builtin:tiny-llama", "sim")
    me = {"pid": os.getpid(), "host": socket.gethostname(), "boot_id": boot_id()}
    m.stage("model").data.update(state="running", owner=me)
    m.save()
    with RunLock(m.run_dir):  # this process's pipeline holds the run: the stage is live
        assert ws.open_run(m.run_id).stage("model").state == "running"
    assert ws.open_run(m.run_id).stage("model").state == "interrupted"


def test_without_file_locks_this_processs_running_stage_stays_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a file system without flock the lock says nothing: reopening a run the studio is running marked its live
    stage interrupted (this process's pid was taken for gone)."""
    import errno
    import fcntl
    import os
    import socket

    from hexstudio.core.manifest import boot_id

    ws = Workspace(tmp_path / "ws")
    m = ws.create_run("builtin:tiny-llama", "sim")
    me = {"pid": os.getpid(), "host": socket.gethostname(), "boot_id": boot_id()}
    m.stage("model").data.update(state="running", owner=me)
    m.save()

    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    assert ws.open_run(m.run_id).stage("model").state == "running"


def test_a_lock_whose_pid_cannot_be_written_is_still_taken_and_given_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk too full to write the pid into .lock raised after flock succeeded: the descriptor leaked, holding
    the lock, and every later run of the run was refused as busy until the studio exited."""
    import errno
    import os

    from hexstudio.core.runs import RunLock

    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def full(*_a: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    lock = RunLock(run_dir)
    lock.acquire()
    assert lock.held
    lock.release()
    monkeypatch.undo()
    with RunLock(run_dir) as again:
        assert again.held


def test_two_makers_drawing_one_run_id_keep_both_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The studio and a terminal making a run in the same second with the same 2-byte suffix: the second maker's
    failure removed the first one's half-built folder (and said "free disk space"). Now it draws another id."""
    from hexstudio.core import runs

    ws = runs.Workspace(tmp_path / "ws")
    draws = iter(["abcd"])
    monkeypatch.setattr(runs._secrets, "token_hex", lambda _n: next(draws))
    monkeypatch.setattr(runs.time, "strftime", lambda *_a: "20261129-120000")
    first = ws.create_run("builtin:tiny-llama", "sim")
    # the other maker is half way through the same id
    other = ws.runs_dir / ".creating-20261129-120000-tiny-llama-abcd"
    other.mkdir()
    (other / "mine.txt").write_text("half-built")
    draws = iter(["abcd", "ef01"])
    second = ws.create_run("builtin:tiny-llama", "sim")
    assert first.run_id.endswith("-abcd") and second.run_id.endswith("-ef01")
    assert (other / "mine.txt").read_text() == "half-built"  # never removed by a maker it does not belong to
    assert {r.run_id for r in ws.list_runs()} == {first.run_id, second.run_id}
