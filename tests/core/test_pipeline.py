"""The pipeline and job runner with real worker processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.jobs import EventStream, classify
from hexstudio.core.manifest import RunManifest, validate_manifest
from hexstudio.core.pipeline import Pipeline
from hexstudio.core.runs import RunBusy, RunLock, Workspace
from hexstudio.core.stage_state import display_state
from hexstudio.core.stages import get_stage
from tests.core.conftest import fake_stages
from tests.support.processes import alive

REPO = Path(__file__).resolve().parents[2]


def _run(pipe: Pipeline, until: str) -> Any:
    return asyncio.run(pipe.run(until=until))


def test_ok_run_records_artifacts_and_validates(workspace: Workspace) -> None:
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    res = _run(Pipeline(m, stages=fake_stages()), "preflight")
    assert res.ok, res
    assert res.ran == ["model", "preflight"]
    data = json.loads((m.run_dir / "run.json").read_text())
    validate_manifest(data)
    st = data["stages"]["model"]
    assert st["state"] == "done"
    assert st["metrics"]["answer"]["value"] == 42
    (art,) = st["artifacts"]
    assert art["path"] == "artifacts/model/result.txt" and art["role"] == "result"
    assert len(art["sha256"]) == 64 and art["size"] == (m.run_dir / art["path"]).stat().st_size
    assert not (m.run_dir / "artifacts" / "model.partial").exists()
    # the resource sampler wrote a time series for the report/GUI
    assert (m.run_dir / "logs" / "model.resources.jsonl").exists()
    assert (m.run_dir / "logs" / "model.jsonl").read_text().count('"type": "done"') == 1


def test_a_stages_output_is_on_disk_before_run_json_says_done(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.json (fsynced) recorded "done" with every file's size and sha256 while the files themselves were left to
    the kernel's writeback: a power cut then brought them back empty, and hours of quantizing ran again with a
    message blaming the inputs. Each file and folder of the output is forced to disk first, the rename too."""
    from hexstudio.core import atomic

    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    assert _run(Pipeline(m, stages=fake_stages()), "model").ok
    partial, artifacts = str(m.run_dir / "artifacts" / "model.partial"), str(m.run_dir / "artifacts")
    result = partial + "/result.txt"
    done = max(
        i for i, p in enumerate(synced) if p.endswith("run.json") or "/.run.json" in p or "run.json." in p
    )
    assert result in synced and synced.index(result) < done, synced  # the file, before the record of it
    assert partial in synced and artifacts in synced[synced.index(result) :], synced  # its folder; the rename


def test_a_stage_reads_the_keyring_off_the_event_loop(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every worker stage's start read the tokens from the keyring on the event loop, the studio's window: a keyring
    locked while the user was away froze the window at the next stage until its unlock prompt was answered."""
    from hexstudio.core import stage_api
    from tests.support.threads import record_threads

    threads = record_threads(monkeypatch, stage_api, "worker_env")
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    assert _run(Pipeline(m, stages=fake_stages()), "model").ok
    assert threads and "MainThread" not in threads, threads


def test_resume_skips_current_stages_and_reruns_changed_ones(workspace: Workspace) -> None:
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    assert _run(Pipeline(m, stages=fake_stages()), "preflight").ok
    m2 = workspace.open_run(m.run_id)
    res = _run(Pipeline(m2, stages=fake_stages()), "preflight")
    assert res.ok and res.ran == [] and res.skipped == ["model", "preflight"]
    # a changed input makes the stage stale and it runs again
    m2.settings["context_length"] = 1024
    m2.save()
    model_stage = fake_stages()[0]
    assert display_state(m2, "model", model_stage) == "stale"
    res = _run(Pipeline(m2, stages=fake_stages()), "preflight")
    # model's output changed (the test worker writes its pid), so preflight re-runs too
    assert res.ran == ["model", "preflight"]
    assert display_state(m2, "model", model_stage) == "done"


def test_a_file_edited_while_its_stage_runs_leaves_the_stage_stale(
    workspace: Workspace, tmp_path: Path
) -> None:
    """The stage's input hash was taken when it ended: a calibration text edited during hours of quantization
    made the stage, built from the old text, look current for the new one. It is taken when the stage starts."""
    import dataclasses

    text = tmp_path / "cal.txt"
    text.write_text("the text the stage starts from")
    (base,) = fake_stages(("model",))
    stage = dataclasses.replace(base, inputs=(*base.inputs, "calibration_text"))
    m = workspace.create_run(
        "builtin:tiny-llama", "sim", {"mode": "slow", "seconds": 1, "calibration_text": str(text)}
    )

    def on_event(name: str, ev: dict[str, Any]) -> None:
        if ev["type"] == "progress" and text.read_text() == "the text the stage starts from":
            text.write_text("edited while the stage ran")

    res = asyncio.run(Pipeline(m, stages=(stage,), on_event=on_event).run(until="model"))
    assert res.ok and text.read_text() == "edited while the stage ran", res
    assert display_state(RunManifest.load(m.run_dir), "model", stage) == "stale"


def _start_pipeline_in_thread(m: RunManifest, until: str) -> tuple[dict[str, Any], Any]:
    """Run the pipeline on its own loop in a thread; return (shared state, thread)."""
    import threading

    shared: dict[str, Any] = {"progress": 0}

    def on_event(stage: str, ev: dict[str, Any]) -> None:
        if ev["type"] == "progress":
            shared["progress"] += 1

    pipe = Pipeline(m, stages=fake_stages(), on_event=on_event)
    shared["pipe"] = pipe

    def target() -> None:
        async def go() -> None:
            shared["loop"] = asyncio.get_running_loop()
            shared["result"] = await pipe.run(until=until)

        asyncio.run(go())

    th = threading.Thread(target=target, daemon=True)
    th.start()
    return shared, th


def _wait(cond: Any, timeout: float = 30.0) -> None:
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def test_kill9_of_worker_leaves_run_intact_and_resume_completes(workspace: Workspace) -> None:
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "slow", "seconds": 1.5})
    shared, th = _start_pipeline_in_thread(m, "model")
    _wait(lambda: shared["progress"] >= 3 and shared["pipe"].current_job is not None)
    job = shared["pipe"].current_job
    os.kill(job.proc.pid, signal.SIGKILL)
    th.join(30)
    res = shared["result"]
    assert not res.ok
    data = json.loads((m.run_dir / "run.json").read_text())  # intact, parseable
    validate_manifest(data)
    st = data["stages"]["model"]
    assert st["state"] == "interrupted"
    assert st["outcome"]["kind"] == "killed" and "SIGKILL" in st["outcome"]["message"]
    assert not (m.run_dir / "artifacts" / "model").exists()
    assert not (m.run_dir / "artifacts" / "model.partial").exists()
    m2 = workspace.open_run(m.run_id)
    res2 = asyncio.run(Pipeline(m2, stages=fake_stages()).run(until="model"))
    assert res2.ok and res2.ran == ["model"]
    assert (m2.run_dir / "artifacts" / "model" / "result.txt").read_text() == "complete\n"
    assert m2.stage("model").data["attempts"] == 2


def _drive(workspace: Workspace, m: RunManifest, tmp_path: Path) -> subprocess.Popen[bytes]:
    """Another process (as a second studio would) runs m's pipeline with the fake stages until the model stage."""
    script = tmp_path / "drive.py"
    script.write_text(
        "import asyncio\n"
        "from hexstudio.core.runs import Workspace\n"
        "from hexstudio.core.pipeline import Pipeline\n"
        "from tests.core.conftest import fake_stages\n"
        f"m = Workspace({str(workspace.root)!r}).open_run({m.run_id!r})\n"
        "asyncio.run(Pipeline(m, stages=fake_stages()).run(until='model'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=env)


def test_kill9_of_the_studio_process_marks_stage_interrupted(workspace: Workspace, tmp_path: Path) -> None:
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "slow", "seconds": 30})
    proc = _drive(workspace, m, tmp_path)
    log = m.run_dir / "logs" / "model.jsonl"
    _wait(lambda: proc.poll() is not None or (log.exists() and log.read_text().count("progress") >= 3))
    assert proc.poll() is None, "the driver process died early"
    proc.kill()
    proc.wait()
    m2 = workspace.open_run(m.run_id)  # detects the dead owner
    assert m2.stage("model").state == "interrupted"
    m2.settings["seconds"] = 0.2
    m2.save()
    res = asyncio.run(Pipeline(m2, stages=fake_stages()).run(until="model"))
    assert res.ok
    assert m2.stage("model").state == "done"


@pytest.mark.parametrize(
    ("mode", "kind", "needle"),
    [
        ("garbage", "failed", "without reporting 'done'"),
        ("crash", "failed", "exit code 3"),
        ("error", "failed", "The calibration file is empty."),
    ],
)
def test_worker_failures_are_clear(workspace: Workspace, mode: str, kind: str, needle: str) -> None:
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": mode})
    res = _run(Pipeline(m, stages=fake_stages()), "model")
    assert not res.ok and res.stopped_at == "model"
    out = m.stage("model").data["outcome"]
    assert out["kind"] == kind
    assert needle in out["message"]
    if mode == "crash":
        assert "segfault-like crash" in out["message"]
    if mode == "error":
        assert out["code"] == "bad_input" and out["hint"] == "Choose a text file with some prose."
    assert m.stage("model").state == "failed"
    assert not (m.run_dir / "artifacts" / "model").exists()


def _slow_model_stage_with_a_child(
    workspace: Workspace, tmp_path: Path
) -> tuple[RunManifest, dict[str, Any], Any, int]:
    """A run whose Model stage (the test worker, mode slow) runs in a thread and has started a child process:
    (the run, the thread's shared state, the thread, the child's pid)."""
    pidfile = tmp_path / "child.pid"
    m = workspace.create_run(
        "builtin:tiny-llama", "sim", {"mode": "slow", "seconds": 60, "child_pidfile": str(pidfile)}
    )
    shared, th = _start_pipeline_in_thread(m, "model")
    _wait(lambda: pidfile.exists() and pidfile.read_text() and shared["pipe"].current_job is not None)
    return m, shared, th, int(pidfile.read_text())


def test_cancel_leaves_no_orphan_process(workspace: Workspace, tmp_path: Path) -> None:
    m, shared, th, child = _slow_model_stage_with_a_child(workspace, tmp_path)
    pgid = shared["pipe"].current_job.pgid
    fut = asyncio.run_coroutine_threadsafe(shared["pipe"].cancel(), shared["loop"])
    fut.result(30)
    th.join(30)
    assert shared["result"].ok is False
    assert m.stage("model").state == "cancelled"
    _wait(lambda: not _group_members(pgid), 10)
    _wait(lambda: not alive(child), 10)
    assert not (m.run_dir / "artifacts" / "model").exists()


def test_a_worker_killed_from_outside_ends_its_job_though_its_child_holds_the_pipes(
    workspace: Workspace, tmp_path: Path
) -> None:
    """The OOM killer took the worker, not the process it had started: that child kept the worker's stdout
    and stderr open, so the job waited for it (here 600 s), the stage stayed "running", and Stop did nothing
    because the worker had already exited."""
    m, shared, th, child = _slow_model_stage_with_a_child(workspace, tmp_path)
    t0 = time.monotonic()
    os.kill(shared["pipe"].current_job.proc.pid, signal.SIGKILL)  # the worker alone, as the OOM killer does
    th.join(30)
    assert not th.is_alive() and time.monotonic() - t0 < 15
    res = shared["result"]
    assert res.ok is False and m.stage("model").state == "interrupted" and "killed by SIGKILL" in res.message
    _wait(lambda: not alive(child), 10)


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(d.name))
    return out


def test_missing_worker_reports_not_implemented(workspace: Workspace) -> None:
    import dataclasses

    stage = dataclasses.replace(get_stage("compile"), worker="hexstudio.workers.no_such_worker", needs=())
    m = workspace.create_run("builtin:tiny-llama", "sim", {})
    res = asyncio.run(Pipeline(m, stages=(stage,)).run(until="compile"))
    assert not res.ok
    assert m.stage("compile").data["outcome"]["kind"] == "not_implemented"
    assert "not implemented yet" in res.message


def test_sigkill_at_high_rss_is_reported_as_likely_oom() -> None:
    stream = EventStream(None, None)
    r = classify(-9, stream, False, peak_rss=10**15, stderr_tail="", what="The Quantize stage")
    assert r.kind == "oom"
    assert "likely out of memory" in r.message
    assert ".wslconfig" in (r.hint or "") and "wsl --shutdown" in (r.hint or "")
    r2 = classify(-9, stream, False, peak_rss=10**6, stderr_tail="", what="x")
    assert r2.kind == "killed"


def test_a_kill_the_kernels_oom_counter_saw_is_out_of_memory_at_any_rss() -> None:
    """The OOM killer acts on the whole machine's memory: a worker at 1 MB RSS, killed while a browser and the
    studio held the rest, read "killed by something outside HexStudio; resume" (and ran out again)."""
    from hexstudio.core.jobs import oom_kills

    stream = EventStream(None, None)
    r = classify(
        -9, stream, False, peak_rss=10**6, stderr_tail="", what="The Quantize stage", oom_killed=True
    )
    assert r.kind == "oom" and "out-of-memory killer" in r.message and r.code == "out_of_memory", r
    # /proc/vmstat's oom_kill where Linux has it (since 4.13)
    assert isinstance(oom_kills(), int) if Path("/proc/vmstat").exists() else oom_kills() is None


def test_an_oom_kill_with_much_swap_is_still_out_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Judged against RAM + swap, a real OOM kill at 11 GiB RSS on 16 GiB RAM with 16 GiB swap (the .wslconfig
    advice) read "killed by something outside HexStudio": RSS leaves out swapped-out pages."""
    from types import SimpleNamespace

    from hexstudio.core import jobs

    gib = 1 << 30
    monkeypatch.setattr(jobs.psutil, "virtual_memory", lambda: SimpleNamespace(total=16 * gib))
    monkeypatch.setattr(jobs.psutil, "swap_memory", lambda: SimpleNamespace(total=16 * gib))
    monkeypatch.setattr(jobs.Path, "read_text", lambda self, *a, **k: "max")  # no cgroup limit
    r = classify(-9, EventStream(None, None), False, peak_rss=11 * gib, stderr_tail="", what="x")
    assert r.kind == "oom" and r.code == "out_of_memory"
    # a container's limit below RAM is the ceiling
    monkeypatch.setattr(jobs.Path, "read_text", lambda self, *a, **k: str(4 * gib))
    r = classify(-9, EventStream(None, None), False, peak_rss=3 * gib, stderr_tail="", what="x")
    assert r.kind == "oom"


def test_oom_hint_limits_come_from_the_estimate_and_the_peak() -> None:
    import re

    from hexstudio.core.jobs import oom_hint
    from hexstudio.shared.wslconfig import target_limits

    GiB = 1024**3
    h = oom_hint(40 * GiB, 150 * GiB, ram_bytes=64 * GiB, swap_bytes=16 * GiB)
    mem, swap = (int(x) for x in re.search(r"memory=(\d+)GB\nswap=(\d+)GB", h).groups())  # type: ignore[union-attr]
    assert (mem, swap) == target_limits(150 * GiB) and mem * GiB >= 150 * GiB
    assert "150.0 GiB" in h and "64.0 GiB RAM + 16.0 GiB swap" in h and "wsl --shutdown" in h
    # no estimate: from what the process reached
    h2 = oom_hint(100 * GiB, None, ram_bytes=64 * GiB, swap_bytes=0)
    assert f"memory={target_limits(100 * GiB)[0]}GB" in h2 and "176GB" not in h2
    # classify passes the stage's estimate through
    r = classify(
        -9,
        EventStream(None, None),
        False,
        peak_rss=10**15,
        stderr_tail="",
        what="The Quantize stage",
        memory_need=2 * 10**15,
    )
    assert f"memory={target_limits(2 * 10**15)[0]}GB" in (r.hint or "")


def test_gate_failure_stops_and_override_is_recorded(workspace: Workspace) -> None:
    import dataclasses

    from hexstudio.core.stages import GateResult

    def gate(_m: RunManifest) -> GateResult:
        return GateResult(False, "threshold missed", overridable=True)

    st = dataclasses.replace(fake_stages(("model",))[0], verdict=gate)
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    pipe = Pipeline(m, stages=(st,))
    res = asyncio.run(pipe.run(until="model"))
    assert not res.ok and "gate not passed" in res.message and "--override-gate" in (res.hint or "")
    pipe.override_gate("model", "accepted by the user: toy model")
    res = asyncio.run(Pipeline(m, stages=(st,)).run(until="model"))
    assert res.ok
    assert m.stage("model").data["gate"]["override"]["reason"] == "accepted by the user: toy model"
    # the stage runs again (its inputs changed): the override was for the result it replaces, and lapses
    res = asyncio.run(Pipeline(m, stages=(st,)).run(until="model", force=True))
    assert not res.ok and "gate not passed" in res.message, res
    assert "model" not in (m.settings.get("override_gates") or [])
    assert m.stage("model").data["gate"]["override"] is None
    assert any(e["kind"] == "gate_override_lapsed" and e["stage"] == "model" for e in m.data["events"])
    # an override given for this run covers what the stage gives now
    pipe = Pipeline(m, stages=(st,))
    pipe.override_gate("model", "accepted again")
    assert asyncio.run(pipe.run(until="model", force=True)).ok


def test_only_refuses_a_stage_whose_upstream_gate_failed_until_overridden(workspace: Workspace) -> None:
    stages = fake_stages(("model", "quantize", "validate", "compile"))
    m = workspace.create_run(
        "builtin:tiny-llama", "sim", {"mode": "ok", "metrics_validate": {"verdict": "fail"}}
    )
    res = _run(Pipeline(m, stages=stages), "validate")
    assert not res.ok and res.stopped_at == "validate" and m.stage("validate").state == "done"
    # `run --only compile` after the failed validation: refused, compile never starts
    res = asyncio.run(Pipeline(m, stages=stages).run(only="compile"))
    assert not res.ok and res.stopped_at == "compile" and res.ran == []
    assert "Validate gate did not pass" in res.message and "verdict is 'fail'" in res.message
    assert res.hint and f"hexstudio run --resume {m.run_id} --override-gate validate" in res.hint
    assert m.stage("compile").state == "pending"
    assert not (m.run_dir / "artifacts" / "compile").exists()
    # a setting alone is not an override: the recorded override event is what counts
    m.settings["override_gates"] = ["validate"]
    m.save()
    assert not asyncio.run(Pipeline(m, stages=stages).run(only="compile")).ok
    # the recorded override lets it through
    pipe = Pipeline(m, stages=stages)
    pipe.override_gate("validate", "override requested in a test")
    res = asyncio.run(pipe.run(only="compile"))
    assert res.ok and res.ran == ["compile"], res
    assert m.stage("compile").state == "done"


def test_only_runs_when_upstream_gates_passed(workspace: Workspace) -> None:
    stages = fake_stages(("model", "quantize", "validate", "compile"))
    m = workspace.create_run(
        "builtin:tiny-llama", "sim", {"mode": "ok", "metrics_validate": {"verdict": "pass"}}
    )
    assert _run(Pipeline(m, stages=stages), "validate").ok
    res = asyncio.run(Pipeline(m, stages=stages).run(only="compile"))
    assert res.ok and res.ran == ["compile"]


def test_a_second_runner_is_refused_while_a_stage_is_live(workspace: Workspace, tmp_path: Path) -> None:
    """A real second process: `run --resume` (or the GUI) on a run whose stage is live gets a clear
    error and leaves the live worker's .partial alone; after kill -9 of the runner the OS releases the
    lock and a resume goes ahead."""
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "slow", "seconds": 60})
    proc = _drive(workspace, m, tmp_path)
    partial = m.run_dir / "artifacts" / "model.partial"
    try:
        _wait(lambda: proc.poll() is not None or (partial / "half.txt").exists())
        assert proc.poll() is None, "the driver process died early"
        # another process resumes the same run
        second = subprocess.run(
            [
                sys.executable,
                "-c",
                "import asyncio, json\n"
                "from hexstudio.core.runs import Workspace\n"
                "from hexstudio.core.pipeline import Pipeline\n"
                "from tests.core.conftest import fake_stages\n"
                f"m = Workspace({str(workspace.root)!r}).open_run({m.run_id!r})\n"
                "r = asyncio.run(Pipeline(m, stages=fake_stages()).run(until='model'))\n"
                "print(json.dumps({'ok': r.ok, 'message': r.message, 'hint': r.hint, 'ran': r.ran}))\n",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        res = json.loads(second.stdout.strip().splitlines()[-1])
        assert not res["ok"] and res["ran"] == []
        assert f"Run {m.run_id} is being run by PID {proc.pid} on this machine" in res["message"]
        assert "wait" in res["hint"].lower() and "cancel" in res["hint"].lower()
        assert (partial / "half.txt").read_text() == "half-written output\n"  # untouched
        assert json.loads((m.run_dir / "run.json").read_text())["stages"]["model"]["state"] == "running"
        # in this process too (the GUI beside a CLI run), and deleting the run is refused
        res2 = asyncio.run(Pipeline(workspace.open_run(m.run_id), stages=fake_stages()).run(until="model"))
        assert not res2.ok and f"PID {proc.pid}" in res2.message
        with pytest.raises(RunBusy):
            workspace.delete_run(m.run_id)
        assert proc.poll() is None
    finally:
        proc.kill()  # kill -9: no cleanup code runs, the kernel drops the flock
        proc.wait()
    m2 = workspace.open_run(m.run_id)
    assert m2.stage("model").state == "interrupted"
    m2.settings["seconds"] = 0.2
    m2.save()
    res3 = asyncio.run(Pipeline(m2, stages=fake_stages()).run(until="model"))
    assert res3.ok, res3
    assert m2.stage("model").state == "done"
    # the lock is released after a run: the next runner gets it at once
    lock = RunLock(m2.run_dir)
    lock.acquire()
    lock.release()


def test_cancel_escalates_to_sigkill_for_a_worker_that_ignores_sigint_and_sigterm(
    workspace: Workspace, tmp_path: Path
) -> None:
    pidfile, siglog = tmp_path / "child.pid", tmp_path / "signals.log"
    m = workspace.create_run(
        "builtin:tiny-llama",
        "sim",
        {"mode": "stubborn", "child_pidfile": str(pidfile), "signal_log": str(siglog)},
    )
    shared, th = _start_pipeline_in_thread(m, "model")
    _wait(lambda: pidfile.exists() and pidfile.read_text() and shared["pipe"].current_job is not None)
    job = shared["pipe"].current_job
    job.grace_s, job.term_s = 0.5, 0.5  # SIGINT, then SIGTERM to the group, each given half a second
    pgid, worker, child = job.pgid, job.proc.pid, int(pidfile.read_text())
    t0 = time.monotonic()
    asyncio.run_coroutine_threadsafe(shared["pipe"].cancel(), shared["loop"]).result(30)
    th.join(30)
    elapsed = time.monotonic() - t0
    # both polite signals arrived and were ignored, so SIGKILL ended it
    noted = siglog.read_text()
    assert f"SIGINT ignored by {worker}" in noted and f"SIGTERM ignored by {worker}" in noted
    assert 1.0 <= elapsed < 15, elapsed
    res = shared["result"]
    assert not res.ok and res.stopped_at == "model"
    out = m.stage("model").data["outcome"]
    assert out["kind"] == "cancelled" and out["signal"] == "SIGKILL" and out["code"] == "cancelled"
    assert m.stage("model").state == "cancelled"
    _wait(lambda: not _group_members(pgid), 10)  # the child that ignored SIGTERM went with the group
    _wait(lambda: not alive(child), 10)
    assert not (m.run_dir / "artifacts" / "model.partial").exists()


def test_the_stage_estimate_reaches_the_job_for_the_oom_hint(workspace: Workspace) -> None:
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    assert _run(Pipeline(m, stages=fake_stages()), "model").ok
    (m.run_dir / "artifacts" / "model" / "model.json").write_text(
        json.dumps({"estimates": {"quantize_peak_rss_bytes": 123 * 1024**3}})
    )
    pipe = Pipeline(m, stages=fake_stages())
    assert pipe._memory_need(get_stage("quantize")) == 123 * 1024**3
    assert pipe._memory_need(get_stage("compile")) is None


def test_the_same_pipeline_cannot_run_twice_at_once(workspace: Workspace) -> None:
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "slow", "seconds": 1.0})
    pipe = Pipeline(m, stages=fake_stages())

    async def both() -> tuple[Any, Any]:
        first = asyncio.ensure_future(pipe.run(until="model"))
        while pipe.current_job is None:
            await asyncio.sleep(0.02)
        second = await pipe.run(until="model")
        return await first, second

    first, second = asyncio.run(both())
    assert first.ok and not second.ok and f"PID {os.getpid()}" in second.message
    assert m.stage("model").state == "done" and m.stage("model").data["attempts"] == 1


def test_a_filesystem_without_flock_runs_unguarded(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import fcntl

    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    monkeypatch.setattr(fcntl, "flock", no_flock)
    seen: list[dict[str, Any]] = []
    pipe = Pipeline(m, stages=fake_stages(), on_event=lambda stage, ev: seen.append(ev))
    assert asyncio.run(pipe.run(until="model")).ok
    assert pipe.lock.unsupported and not pipe.lock.held
    # said, not only flagged: an NFS or CIFS workspace lets the studio and the CLI run the run at once
    assert any(ev.get("code") == "run_unguarded" and "flock" in ev["message"] for ev in seen), seen
    assert any(e.get("kind") == "run_unguarded" for e in RunManifest.load(m.run_dir).data["events"])


def test_a_bad_setting_in_run_json_fails_the_stage_naming_it(workspace: Workspace) -> None:
    """A run.json edited by hand (or written by a version with other ranges): the worker stage fails at once,
    saying which setting and how to change it, and the run is not left 'running'."""
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    m.settings["kv_bits"] = "8"
    m.save()
    res = asyncio.run(Pipeline(m, stages=fake_stages()).run(until="model"))
    assert not res.ok and "kv_bits must be a whole number" in res.message, res
    st = m.stage("model")
    assert st.state == "failed" and st.data["outcome"]["code"] == "bad_setting"
    assert "--set NAME=VALUE" in str(st.data["outcome"]["hint"])


def _terminal_run(workspace: Workspace, run_id: str, stage: str) -> None:
    """What `hexstudio run --resume RUN --override-gate STAGE` records from a terminal: its own copy of run.json,
    read, changed under the lock and saved."""
    pipe = Pipeline(workspace.open_run(run_id), stages=fake_stages(("model",)))
    pipe.override_gate(stage, "overridden from a terminal")
    pipe.m.stage("model").data["state"] = "done"
    with pipe.lock:
        pipe.m.save()


def test_an_older_copy_of_the_run_never_overwrites_what_another_process_recorded(
    workspace: Workspace,
) -> None:
    """The studio holds run.json from when it opened the run; a terminal then runs stages and records an
    override. A setting changed in the studio, or a run it starts, keeps what the terminal recorded."""
    from hexstudio.core.runs import edit_run

    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    studio = workspace.open_run(m.run_id)
    _terminal_run(workspace, m.run_id, "validate")

    def set_context(m: RunManifest) -> None:
        m.settings["context_length"] = 1024

    edit_run(studio, set_context, "the setting context_length")
    disk = RunManifest.load(m.run_dir)
    assert disk.settings["context_length"] == 1024
    assert disk.settings["override_gates"] == ["validate"] and disk.stage("model").state == "done"
    assert [e["kind"] for e in disk.data["events"]][-1:] == ["gate_override"]
    # a pipeline started on an older copy takes the file's settings and events, not only its stages
    older = workspace.open_run(m.run_id)
    _terminal_run(workspace, m.run_id, "compile")
    assert asyncio.run(Pipeline(older, stages=fake_stages(("model",))).run(until="model")).ok
    disk = RunManifest.load(m.run_dir)
    assert disk.settings["override_gates"] == ["validate", "compile"]
    assert sum(e["kind"] == "gate_override" for e in disk.data["events"]) == 2


def test_a_change_to_a_run_another_process_runs_is_refused_and_says_so(workspace: Workspace) -> None:
    from hexstudio.core.runs import edit_run

    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    before = (m.run_dir / "run.json").read_bytes()
    with RunLock(m.run_dir):
        with pytest.raises(RunBusy) as busy:
            Pipeline(workspace.open_run(m.run_id)).override_gate("validate", "from a second window")
        assert "the validate gate's override was not changed" in busy.value.message
        assert "change it again" in (busy.value.hint or "")
        with pytest.raises(RunBusy):
            edit_run(workspace.open_run(m.run_id), lambda _m: None, "the setting ar_n")
    assert (m.run_dir / "run.json").read_bytes() == before


@pytest.mark.parametrize("where", ["begin", "hash", "lock"])
def test_a_run_folder_that_cannot_be_written_is_a_failure_not_a_bug(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A full disk (or a run folder sudo made root's) while a stage began, or while its output was hashed after a
    successful worker, escaped the pipeline as an OSError: "a HexStudio bug" in the CLI, and the stage stayed
    "running" in the studio (this live process's pid) until a restart."""
    import errno

    from hexstudio.core import pipeline as pipeline_mod
    from hexstudio.core.stage_record import StageAttempt

    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})

    def full(*_a: Any, **_k: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device", str(m.run_dir / "artifacts"))

    target = {
        "begin": (StageAttempt, "begin"),
        "hash": (pipeline_mod, "hash_tree"),
        "lock": (RunLock, "acquire"),
    }
    monkeypatch.setattr(*target[where], full)
    res = _run(Pipeline(m, stages=fake_stages()), "model")
    assert not res.ok and "the disk is full" in res.message and res.hint, res
    if where != "lock":  # the lock is taken before any stage: nothing of the run changed
        assert res.stopped_at == "model" and "df -h" in (res.hint or "")
        assert m.stage("model").state == "failed"
        assert json.loads((m.run_dir / "run.json").read_text())["stages"]["model"]["state"] == "failed"
        assert not (m.run_dir / "artifacts" / "model.partial").exists()


def test_only_says_when_a_stage_runs_on_an_out_of_date_upstream(workspace: Workspace) -> None:
    """`--set <a quantize setting>` then `--only compile`: compile was skipped as current (quantize's output had
    not changed) and the run said ok, nothing more; with --force it ran on what the old setting made. Both are
    said now, with how to redo what changed."""
    stages = fake_stages(("model", "quantize", "validate", "compile"))
    m = workspace.create_run(
        "builtin:tiny-llama", "sim", {"mode": "ok", "metrics_validate": {"verdict": "pass"}}
    )
    assert _run(Pipeline(m, stages=stages), "compile").ok
    m.settings["weight_bits"] = 8 if m.settings.get("weight_bits") != 8 else 4  # a Quantize input
    m.save()
    for force in (False, True):
        seen: list[dict[str, Any]] = []
        pipe = Pipeline(m, stages=stages, on_event=lambda _stage, ev, seen=seen: seen.append(ev))
        res = asyncio.run(pipe.run(only="compile", force=force))
        assert res.ok and res.ran == (["compile"] if force else []), res
        (warning,) = [ev for ev in seen if ev.get("code") == "upstream_out_of_date"]
        assert "quantize is out of date" in warning["message"] and "--until compile" in warning["message"]
    res = asyncio.run(Pipeline(m, stages=stages).run(until="compile"))
    assert res.ok and "quantize" in res.ran, res


def close_while_hashing(m: RunManifest, monkeypatch: pytest.MonkeyPatch, until: str) -> None:
    """Run the fake stages up to `until` and cancel the pipeline (the studio closing) while the first finished
    stage's output is hashed; the cancellation must reach the caller."""
    import threading

    from hexstudio.core import pipeline as pipeline_mod

    real, started = pipeline_mod.hash_tree, threading.Event()

    def slow(*a: Any, **k: Any) -> Any:
        started.set()
        time.sleep(0.5)
        return real(*a, **k)

    monkeypatch.setattr(pipeline_mod, "hash_tree", slow)

    async def go() -> None:
        task = asyncio.ensure_future(Pipeline(m, stages=fake_stages()).run(until=until))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())


def test_closing_while_a_finished_stages_output_is_hashed_keeps_the_stage(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The output is hashed off the event loop; a studio closing then (its pipeline task cancelled) lost the
    finished stage: "running" on disk, "interrupted" at the next start, and the output thrown away."""
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    close_while_hashing(m, monkeypatch, "model")
    st = json.loads((m.run_dir / "run.json").read_text())["stages"]["model"]
    assert st["state"] == "done" and st["artifacts"], st
    assert (m.run_dir / "artifacts" / "model" / "result.txt").is_file()


def test_a_cancel_while_a_stage_is_recorded_on_a_full_disk_still_cancels(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage's record failing (a full disk) while the closing studio recorded it swallowed the cancellation:
    the pipeline went on as if nothing had been asked."""
    import errno

    from hexstudio.core.stage_record import StageAttempt

    def full(self: StageAttempt, *a: Any, **k: Any) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    monkeypatch.setattr(StageAttempt, "finish", full)
    close_while_hashing(m, monkeypatch, "preflight")
    assert m.stage("model").state == "failed" and m.stage("preflight").state == "pending"


def test_a_run_whose_lock_is_held_keeps_its_running_stage(workspace: Workspace) -> None:
    """A pipeline in a container (another hostname, another pid space) runs the run on a shared workspace: the
    studio judged its stage's owner by pid and host and showed it "interrupted — resume the run", while the lock
    (held: its holder is alive) said it runs."""
    import json

    from hexstudio.core.runs import load_run

    m = workspace.create_run("builtin:tiny-llama", "sim", {})
    m.mark_running("model")
    doc = json.loads((m.run_dir / "run.json").read_text())
    doc["stages"]["model"]["owner"] = {"pid": 1, "host": "a-container", "boot_id": "another-boot"}
    (m.run_dir / "run.json").write_text(json.dumps(doc))
    with RunLock(m.run_dir):
        assert load_run(m.run_dir).stage("model").state == "running"
    assert load_run(m.run_dir).stage("model").state == "interrupted"  # the lock is free: its holder is gone


def test_a_pid_reused_since_does_not_keep_a_stage_running(workspace: Workspace) -> None:
    """The runner crashed, and its pid went to another process on the same host and boot (containers with small,
    deterministic pids): the stage stayed "running" while the free lock proved that no one runs it."""
    import subprocess

    from hexstudio.core.runs import load_run

    m = workspace.create_run("builtin:tiny-llama", "sim", {})
    m.mark_running("model")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        doc = json.loads((m.run_dir / "run.json").read_text())
        doc["stages"]["model"]["owner"]["pid"] = other.pid  # alive, on this host and boot: not the runner
        (m.run_dir / "run.json").write_text(json.dumps(doc))
        assert load_run(m.run_dir).stage("model").state == "interrupted"
    finally:
        other.kill()
        other.wait(10)


def test_a_full_disk_as_the_worker_starts_does_not_orphan_it(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.json's note of where the worker runs could not be written (a full disk) just after the worker
    started: the stage failed and its partial folder was deleted under a worker left running with no record to
    find it by. The note is only a hint for a resume after a crash: the stage goes on."""
    import errno

    real_save, refused = RunManifest.save, []

    def save(self: RunManifest) -> None:
        if self.stage("model").data.get("worker") and not refused:
            refused.append(True)
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(self)

    monkeypatch.setattr(RunManifest, "save", save)
    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "slow", "seconds": 0.5})
    res = _run(Pipeline(m, stages=fake_stages(("model",))), "model")
    assert refused and res.ok, (res.message, res.hint)
    assert RunManifest.load(m.run_dir).stage("model").state == "done"
