"""A run's heavy stages on a worker host over a real OpenSSH server on loopback.

The "remote" here is this machine, so every test keeps the host's root folder apart from the local run
and checks that the files got there by upload, and back by download (the spec the host ran names only
host paths)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.manifest import RunManifest
from hexstudio.core.pipeline import Pipeline
from hexstudio.core.remote.hosts import connect_worker_host, host_config, worker_hosts
from hexstudio.core.remote.stage import RemoteStageJob
from hexstudio.core.remote.sync import SYNC_MANIFEST, LocalHashes, map_json_paths, upload_tree
from hexstudio.core.runs import Workspace
from hexstudio.core.stages import STAGES, Stage
from tests.core.conftest import FAKE
from tests.support.cli import RUN_BUILTIN
from tests.support.sshd import SshServer, sshd_available

ok, why = sshd_available()
pytestmark = [pytest.mark.sshd, pytest.mark.skipif(not ok, reason=why)]


def _add_host(srv: SshServer, root: Path, name: str = "box", trust: bool = True, **extra: Any) -> None:
    from hexstudio.core.device.connect import known_hosts_path
    from hexstudio.core.settings import Settings

    if trust:
        known_hosts_path().parent.mkdir(parents=True, exist_ok=True)
        known_hosts_path().write_text(srv.known_hosts_line + "\n")
    s = Settings.load()
    worker_hosts(s)[name] = srv.key_config(**{"python": sys.executable, "root": str(root), **extra})
    s.save()


def _stages() -> tuple[Stage, ...]:
    """model: the fake worker, here; quantize: the self-test worker, heavy, so it runs on the worker host."""
    by = {s.name: s for s in STAGES}
    return (
        dataclasses.replace(by["model"], worker=FAKE, action=None, inputs=("mode",), outputs=("result.txt",)),
        dataclasses.replace(
            by["quantize"],
            worker="hexstudio.workers.selftest",
            inputs=("seconds",),
            outputs=("selftest.json",),
        ),
    )


def _run(m: RunManifest, until: str = "quantize", **kw: Any) -> Any:
    return asyncio.run(Pipeline(m, stages=_stages(), **kw).run(until=until, force=True))


def _quantize_on_box(tmp_path: Path) -> tuple[RunManifest, Any]:
    """A new run on worker host "box" (an sshd on loopback, its root tmp_path/host-root) run up to quantize."""
    with SshServer(tmp_path / "sshd") as srv:
        _add_host(srv, tmp_path / "host-root")
        m = Workspace(tmp_path / "ws").create_run("builtin:tiny-llama", "sim", {"worker_host": "box"})
        return m, asyncio.run(Pipeline(m, stages=_stages()).run(until="quantize"))


def _events(m: RunManifest, stage: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (m.run_dir / "logs" / f"{stage}.jsonl").read_text().splitlines()]


def test_heavy_stage_runs_on_the_worker_host_with_uploaded_inputs_and_downloaded_outputs(
    tmp_path: Path,
) -> None:
    root = tmp_path / "host-root"
    seen: list[tuple[str, dict[str, Any]]] = []
    with SshServer(tmp_path / "sshd") as srv:
        _add_host(srv, root)
        m = Workspace(tmp_path / "ws").create_run(
            "builtin:tiny-llama", "sim", {"worker_host": "box", "seconds": 1}
        )
        res = _run(m, on_event=lambda st, ev: seen.append((st, ev)))
        assert res.ok, (res.message, res.hint)
        m = RunManifest.load(m.run_dir)
        rrun = root / "runs" / m.run_id
        # the model stage ran here (not heavy) and its output was uploaded to the host's run folder
        assert not (rrun / "artifacts" / "model.partial").exists()
        assert (rrun / "artifacts" / "model" / "result.txt").read_text() == (
            m.run_dir / "artifacts" / "model" / "result.txt"
        ).read_text()
        # the host ran the worker on host paths only
        specs = list(root.glob("workers-*/specs/quantize-*.json"))
        assert len(specs) == 1
        spec = json.loads(specs[0].read_text())
        assert spec["run_dir"] == str(rrun) and spec["out_dir"] == str(
            rrun / "artifacts" / "quantize.partial"
        )
        assert spec["upstream"] == {"model": str(rrun / "artifacts" / "model")}
        assert str(m.run_dir) not in specs[0].read_text()
        # its output: kept on the host as the stage's folder there, and downloaded here
        remote_out = rrun / "artifacts" / "quantize" / "selftest.json"
        local_out = m.run_dir / "artifacts" / "quantize" / "selftest.json"
        assert remote_out.is_file() and local_out.read_bytes() == remote_out.read_bytes()
        st = m.stage("quantize")
        assert st.state == "done" and [a["path"] for a in st.artifacts] == [
            "artifacts/quantize/selftest.json"
        ]
        # run.json: the host's peak RSS and which host ran it
        assert st.data["peak_rss_bytes"] and st.data["peak_rss_bytes"] > 5 * 2**20
        assert st.metric_value("worker_host") == "box"
        assert st.metric_value("worker_host_memory_bytes") > 0
        assert m.settings["worker_host"] == "box"
        # the worker's own events came through, and the stage log has them
        kinds = [ev["type"] for s, ev in seen if s == "quantize" and ev.get("source") != "worker_host"]
        assert kinds[0] == "progress" and kinds[-1] == "done" and "artifact" in kinds and "metric" in kinds
        logged = [
            ev["type"]
            for ev in _events(m, "quantize")
            if ev.get("source") != "worker_host" and ev.get("stream") != "stderr"
        ]
        assert logged == kinds
        assert (m.run_dir / "logs" / "quantize.resources.jsonl").read_text().strip()
        # the model stage stayed local: no worker-host events there
        assert all(ev.get("source") != "worker_host" for s, ev in seen if s == "model")

        # again: the model stage's output is already on the host (same size and sha256): nothing is sent
        res2 = asyncio.run(
            Pipeline(RunManifest.load(m.run_dir), stages=_stages()).run(only="quantize", force=True)
        )
        assert res2.ok
        st2 = RunManifest.load(m.run_dir).stage("quantize")
        assert st2.metric_value("worker_host_upload_bytes") == 0
        assert st2.metric_value("worker_host_upload_skipped_files") >= 1


def _cancel_once_it_works(
    tmp_path: Path, srv: SshServer, root: Path, then: Callable[[RemoteStageJob], Awaitable[Any]] | None = None
) -> tuple[RunManifest, Any, float, RemoteStageJob, Any]:
    """A minute's fake quantize on the worker host, cancelled once it reports progress: (the run, the pipeline's
    result, the seconds the cancel took, the stage's job, what `then(job)` gave after it)."""
    import time

    _add_host(srv, root)
    m = Workspace(tmp_path / "ws").create_run(
        "builtin:tiny-llama", "sim", {"worker_host": "box", "seconds": 60}
    )
    assert asyncio.run(Pipeline(m, stages=_stages()).run(until="model")).ok
    pipe = Pipeline(m, stages=_stages())
    progress: list[dict[str, Any]] = []
    pipe.on_event = lambda st, ev: progress.append(ev) if ev["type"] == "progress" else None

    async def go() -> tuple[Any, float, RemoteStageJob, Any]:
        task = asyncio.ensure_future(pipe.run(until="quantize"))
        for _ in range(300):
            if len(progress) >= 3:
                break
            await asyncio.sleep(0.1)
        job = pipe.current_job
        assert isinstance(job, RemoteStageJob) and job.remote is not None
        t0 = time.monotonic()
        await pipe.cancel()
        res = await task
        took = time.monotonic() - t0
        return res, took, job, (await then(job) if then is not None else None)

    return (m, *asyncio.run(go()))


def test_cancel_mid_stage_on_the_worker_host_leaves_nothing_running_and_nothing_kept(tmp_path: Path) -> None:
    root = tmp_path / "host-root"
    with SshServer(tmp_path / "sshd") as srv:

        async def alive_after(job: RemoteStageJob) -> bool:
            assert job.remote is not None
            return await _group_alive(srv, job.remote.remote_pid)

        m, res, _took, _job, alive = _cancel_once_it_works(tmp_path, srv, root, alive_after)
    assert not res.ok and RunManifest.load(m.run_dir).stage("quantize").state == "cancelled"
    assert alive is False
    assert not (m.run_dir / "artifacts" / "quantize.partial").exists()
    assert not (m.run_dir / "artifacts" / "quantize").exists()
    rpart = root / "runs" / m.run_id / "artifacts" / "quantize.partial"
    assert not rpart.exists() or not any(rpart.iterdir())


def test_cancel_over_a_stalled_link_ends_and_notes_the_hosts_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancel waited on the link to the worker host without a limit: over a stalled link (a dropped VPN, a host in
    swap; TCP gives up after a quarter of an hour) closing the studio hung at "Cancelling...", and the host's
    worker, never noted, got a second one beside it on resume. Now the wait is bounded, the worker is noted (a
    resume waits for it) and the connection closed."""
    import signal

    from hexstudio.core.remote import stage as remote_stage
    from hexstudio.core.remote.job import RemoteJob

    async def stalled(self: RemoteJob) -> None:  # the host never answers the cancel ladder
        await asyncio.sleep(3600)

    monkeypatch.setattr(RemoteJob, "cancel", stalled)
    monkeypatch.setattr(remote_stage, "CANCEL_LINK_S", 1.0)
    with SshServer(tmp_path / "sshd") as srv:
        m, res, took, job, _ = _cancel_once_it_works(tmp_path, srv, tmp_path / "host-root")
    pid = job.remote.remote_pid if job.remote is not None else None
    try:
        assert not res.ok and took < 30, took  # the ladder's grace (5 + 3 s) and the link's wait (1 s here)
        note = json.loads((m.run_dir / "logs" / "quantize.host-worker.json").read_text())
        assert note["host"] == "box" and note["pid"] == pid
    finally:
        if pid is not None:  # the host's worker (this machine's sshd), stopped here as the user would
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_cancel_during_the_upload_stops_it_and_starts_nothing_on_the_host(tmp_path: Path) -> None:
    import time

    root = tmp_path / "host-root"
    with SshServer(tmp_path / "sshd") as srv:
        _add_host(srv, root)
        m = Workspace(tmp_path / "ws").create_run("builtin:tiny-llama", "sim", {"worker_host": "box"})
        assert asyncio.run(Pipeline(m, stages=_stages()).run(until="model")).ok
        with open(m.run_dir / "artifacts" / "model" / "weights.bin", "wb") as fh:  # a big upload
            fh.truncate(1 << 30)
        pipe = Pipeline(m, stages=_stages())
        uploading = asyncio.Event()

        def on_event(stage: str, ev: dict[str, Any]) -> None:
            if ev.get("phase") == "upload" and "weights.bin" in ev.get("message", ""):
                uploading.set()

        pipe.on_event = on_event

        async def go() -> tuple[Any, float]:
            task = asyncio.ensure_future(pipe.run(until="quantize"))
            await asyncio.wait_for(uploading.wait(), 120)
            t0 = time.monotonic()
            await pipe.cancel()
            res = await task
            return res, time.monotonic() - t0

        res, took = asyncio.run(go())
    st = RunManifest.load(m.run_dir).stage("quantize")
    assert not res.ok and st.state == "cancelled", st.data.get("outcome")
    assert took < 30
    assert not list(root.glob("workers-*/specs/quantize-*.json"))  # the worker never started there
    assert not (m.run_dir / "artifacts" / "quantize.partial").exists()


async def _group_alive(srv: SshServer, pid: int | None) -> bool:
    assert pid is not None
    # the "host" is this machine: its process table is ours
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(
    "case",
    ["unknown", "unreachable", "key_unknown", "key_changed", "no_python", "no_packages", "root_a_file"],
)
def test_worker_host_problems_fail_the_stage_clearly(tmp_path: Path, case: str) -> None:
    from tests.support.sshd import free_port

    root = tmp_path / "host-root"
    stages = _stages()
    with SshServer(tmp_path / "sshd") as srv:
        extra: dict[str, Any] = {}
        trust = case != "key_unknown"
        if case == "unreachable":
            extra["port"] = free_port()
        if case == "no_python":
            extra["python"] = "/nonexistent/bin/python3"
        if case == "root_a_file":  # the workers cannot be installed there: said so, not "a HexStudio bug"
            root.write_text("")
        if case != "unknown":
            _add_host(srv, root, trust=trust, **extra)
        if case == "key_changed":
            from hexstudio.core.device.connect import known_hosts_path

            other = SshServer(tmp_path / "other-sshd")  # a different host key for the same address
            kind, b64 = other.host_key_pub.split()[:2]
            known_hosts_path().write_text(f"[{srv.host}]:{srv.port} {kind} {b64}\n")
        if case == "no_packages":
            # the real quantize stage's needs, checked against a Python without aimet_onnx
            stages = (stages[0], dataclasses.replace(stages[1], worker="hexstudio.workers.quantize"))
            _add_host(srv, root, python="/usr/bin/python3")
        m = Workspace(tmp_path / "ws").create_run("builtin:tiny-llama", "sim", {"worker_host": "box"})
        res = asyncio.run(Pipeline(m, stages=stages).run(until="quantize"))
    m = RunManifest.load(m.run_dir)
    st = m.stage("quantize")
    assert not res.ok and st.state == "failed"
    assert m.stage("model").state == "done"  # the model stage ran here, before
    code = st.data["outcome"]["code"]
    hint = st.data["outcome"]["hint"] or ""
    expected = {
        "unknown": "worker_host_unknown",
        "unreachable": "worker_host_unreachable",
        "key_unknown": "worker_host_key_unknown",
        "key_changed": "worker_host_key_changed",
        "no_python": "worker_host_python_missing",
        "no_packages": "worker_host_packages_missing",
        "root_a_file": "worker_host_install_failed",
    }[case]
    assert code == expected, st.data["outcome"]
    if case in ("no_python", "no_packages"):
        assert "packaging/install-workstation.sh" in hint and "--python" in hint
    if case == "no_packages":
        assert "aimet_onnx" in st.data["outcome"]["message"]
    if case == "key_unknown":
        assert "hexstudio worker check box --trust SHA256:" in hint
    if case == "key_changed":
        assert "CHANGED" in st.data["outcome"]["message"]
    if case == "unknown":
        assert "hexstudio worker add box" in hint
    if case == "root_a_file":
        assert str(root) in st.data["outcome"]["message"] and "df -h" in hint and "bug" not in hint
    assert not (m.run_dir / "artifacts" / "quantize.partial").exists()
    assert not (m.run_dir / "artifacts" / "quantize").exists()


def test_upload_skips_what_is_there_and_mirrors_the_folder(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text('{"a": 1}')
    (src / "sub" / "weights.bin").write_bytes(os.urandom(300_000))
    dst = tmp_path / "host" / "models" / "hf"

    async def go(srv: SshServer) -> list[tuple[int, int, int]]:
        t = await connect_worker_host("box", host_config("box"))
        out = []
        try:
            for _ in range(2):
                s = await upload_tree(t, sys.executable, src, str(dst), LocalHashes())
                out.append((s.sent_files, s.skipped_files, s.sent_bytes))
            (src / "config.json").write_text('{"a": 2}')  # same size, other content
            (dst / "stale.txt").write_text("left over")
            s = await upload_tree(t, sys.executable, src, str(dst), LocalHashes())
            out.append((s.sent_files, s.skipped_files, s.sent_bytes))
            (dst / SYNC_MANIFEST).unlink()  # no record: the host hashes its copies
            s = await upload_tree(t, sys.executable, src, str(dst), LocalHashes())
            out.append((s.sent_files, s.skipped_files, s.sent_bytes))
        finally:
            await t.close()
        return out

    with SshServer(tmp_path / "sshd") as srv:
        _add_host(srv, tmp_path / "host")
        runs = asyncio.run(go(srv))
    assert runs[0] == (2, 0, 300_000 + 8)
    assert runs[1] == (0, 2, 0)
    assert runs[2] == (1, 1, 8)
    assert runs[3] == (0, 2, 0)
    assert (dst / "config.json").read_text() == '{"a": 2}'
    assert not (dst / "stale.txt").exists()
    assert (dst / "sub" / "weights.bin").read_bytes() == (src / "sub" / "weights.bin").read_bytes()


def test_path_maps_both_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hexstudio.workers.runtime import map_path

    monkeypatch.setenv(
        "HEXSTUDIO_PATH_MAP",
        json.dumps(
            [["/home/me/runs/R", "/srv/h/runs/R"], ["/home/me/models/llama", "/srv/h/models/ab-llama"]]
        ),
    )
    assert map_path("/home/me/models/llama") == "/srv/h/models/ab-llama"
    assert map_path("/home/me/models/llama/config.json") == "/srv/h/models/ab-llama/config.json"
    assert map_path("/home/me/models/llama2") == "/home/me/models/llama2"  # a prefix of a name is no match
    assert map_path("/home/me/runs/R/artifacts/model/hf") == "/srv/h/runs/R/artifacts/model/hf"
    assert map_path("hf") == "hf"
    monkeypatch.delenv("HEXSTUDIO_PATH_MAP")
    assert map_path("/home/me/models/llama") == "/home/me/models/llama"

    out = tmp_path / "quantize.partial"
    out.mkdir()
    (out / "quantize.json").write_text(
        json.dumps(
            {
                "calibration": {"text": "/srv/h/w-1/resources/t/c.txt"},
                "graphs": [{"float_onnx": "float/a.onnx"}],
                "n": 3,
            }
        )
    )
    (out / "other.json").write_text('{"x": "/elsewhere/file"}')
    changed = map_json_paths(out, [("/srv/h/w-1", "/repo"), ("/srv/h/runs/R", "/home/me/runs/R")])
    assert changed == ["quantize.json"]
    doc = json.loads((out / "quantize.json").read_text())
    assert doc == {
        "calibration": {"text": "/repo/resources/t/c.txt"},
        "graphs": [{"float_onnx": "float/a.onnx"}],
        "n": 3,
    }
    # a host folder with a non-ASCII name, in a file written as UTF-8 (validation.json: ensure_ascii=False)
    (out / "validation.json").write_text(
        json.dumps({"text": "/home/jörg/h/runs/R/v.txt"}, ensure_ascii=False), encoding="utf-8"
    )
    assert map_json_paths(out, [("/home/jörg/h/runs/R", "/home/me/runs/R")]) == ["validation.json"]
    assert json.loads((out / "validation.json").read_text(encoding="utf-8")) == {
        "text": "/home/me/runs/R/v.txt"
    }


def test_cli_worker_add_check_and_run_flag(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).with_name("hexstudio"))
    env = {**os.environ}
    with SshServer(tmp_path / "sshd") as srv:
        # first contact without --trust: refused, with the fingerprint to compare
        add = [
            exe,
            "worker",
            "add",
            "box",
            "--host",
            srv.host,
            "--port",
            str(srv.port),
            "--user",
            srv.user,
            "--key",
            str(srv.client_key_path),
            "--python",
            sys.executable,
            "--root",
            str(tmp_path / "r"),
            "--json",
        ]
        p = subprocess.run(
            add, capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL
        )
        assert p.returncode == 1 and srv.host_key_fingerprint in p.stderr, p.stderr
        p = subprocess.run(
            [*add, "--trust", srv.host_key_fingerprint], capture_output=True, text=True, timeout=120, env=env
        )
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc["check"]["stages"]["quantize"]["ok"] and doc["check"]["stages"]["validate"]["ok"]
        assert Path(doc["check"]["workers"], "hexstudio", "shared", "protocol.py").is_file()
        assert Path(
            doc["check"]["workers"],
            "hexstudio",
            "shared",
            "data",
            "builtin_model",
            "text",
            "calibration.txt",
        ).is_file()
        lst = json.loads(
            subprocess.run(
                [exe, "worker", "list", "--json"], capture_output=True, text=True, timeout=60, env=env
            ).stdout
        )
        assert [h["name"] for h in lst["worker_hosts"]] == ["box"]
    # an unknown worker host is refused before a run is made
    p = subprocess.run(
        [
            exe,
            "run",
            "--worker-host",
            "nope",
            "--until",
            "model",
            "--workspace",
            str(tmp_path / "ws"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 1 and "No worker host named 'nope'" in p.stderr
    assert not (tmp_path / "ws" / "runs").exists() or not any((tmp_path / "ws" / "runs").iterdir())


def _worker_events(run_dir: Path, stage: str) -> list[tuple[str, str]]:
    """The worker's own events (not the studio's worker-host lines, not stderr) as (type, what)."""
    out = []
    for line in (run_dir / "logs" / f"{stage}.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev.get("source") == "worker_host" or ev.get("stream") == "stderr":
            continue
        what = {"metric": ev.get("name"), "artifact": ev.get("path"), "done": str(ev.get("ok"))}.get(
            ev["type"], ""
        )
        out.append((ev["type"], str(what)))
    return out


@pytest.mark.slow
def test_real_quantize_on_the_worker_host_streams_the_same_events_as_a_local_run(
    tmp_path: Path, validated_run: Path
) -> None:
    """`hexstudio run --model builtin:tiny-llama --board sim --until quantize --worker-host box`: real
    aimet-onnx on the host, compared with the same command run on this machine (the shared validated run:
    tests/support/runs.py runs `hexstudio run ... --until validate` with the same settings)."""
    from tests.support.runs import FAST_QUANTIZE_SETTINGS

    exe = str(Path(sys.executable).with_name("hexstudio"))
    sets = [x for k, v in FAST_QUANTIZE_SETTINGS.items() for x in ("--set", f"{k}={v}")]
    base = [exe, *RUN_BUILTIN, "--until", "quantize", *sets, "--json", "--quiet"]
    root = tmp_path / "host-root"
    with SshServer(tmp_path / "sshd") as srv:
        _add_host(srv, root)
        p = subprocess.run(
            [*base, "--worker-host", "box", "--workspace", str(tmp_path / "remote-ws")],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert p.returncode == 0, p.stdout + p.stderr
    remote = RunManifest.load(Path(json.loads(p.stdout)["run_dir"]))
    local = RunManifest.load(validated_run)
    assert {k: remote.settings[k] for k in FAST_QUANTIZE_SETTINGS} == {
        k: local.settings[k] for k in FAST_QUANTIZE_SETTINGS
    }

    # the same events, in the same order
    ev_remote, ev_local = (
        _worker_events(remote.run_dir, "quantize"),
        _worker_events(local.run_dir, "quantize"),
    )
    assert ev_remote == ev_local
    assert ev_remote.count(("done", "True")) == 1 and sum(t == "progress" for t, _ in ev_remote) >= 5
    # it really ran there: on the host's copies, and the output came back by download
    rrun = root / "runs" / remote.run_id
    assert (rrun / "artifacts" / "model" / "hf" / "config.json").is_file()
    assert (rrun / "artifacts" / "quantize" / "quantize.json").is_file()
    st = remote.stage("quantize")
    assert st.metric_value("worker_host") == "box"
    # preflight checked the host (the machine doing the heavy work); the model stage ran here
    assert remote.stage("preflight").metric_value("worker_host") == "box"
    assert remote.stage("model").metric_value("worker_host") is None
    # everything came by download (quantize.json then had its host paths mapped back: a few bytes differ)
    down = st.metric_value("worker_host_download_bytes")
    assert down > 10**6 and abs(down - sum(a["size"] for a in st.artifacts)) < 4096
    assert sorted(a["path"] for a in st.artifacts) == sorted(
        a["path"] for a in local.stage("quantize").artifacts
    )
    # run.json holds the host's peak RSS (an aimet-onnx QuantSim is far above 100 MB)
    assert st.data["peak_rss_bytes"] > 100 * 2**20
    assert (
        st.metric_value("int4_lpbq_weight_encodings")
        == local.stage("quantize").metric_value("int4_lpbq_weight_encodings")
        > 0
    )
    # no host path left in the outputs that later local stages read
    doc = json.loads((remote.run_dir / "artifacts" / "quantize" / "quantize.json").read_text())
    assert Path(doc["calibration"]["text"]).is_file() and str(root) not in json.dumps(doc)


@pytest.mark.parametrize(
    ("error", "code", "hint_has_df"),
    [
        (OSError("Failure"), "worker_host_write_failed", True),
        (TimeoutError("timed out"), "worker_host_disconnected", False),
    ],
    ids=["refused", "stalled"],
)
def test_a_host_that_refuses_a_file_is_not_a_dropped_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, code: str, hint_has_df: bool
) -> None:
    """OpenSSH's SFTP server answers a write to a full disk with a bare "Failure" while the connection stays up.
    That is not "the connection dropped" (whose hint, check the network and resume, would loop): the stage says
    the host refused the file and to check its free space. A read that timed out (the Wi-Fi went, TCP has not given
    up yet, paramiko still says connected) is an OSError too, and is the dropped connection, not a full disk."""
    from hexstudio.core.device.transport import SshTransport

    async def failing(self: SshTransport, *a: Any, **kw: Any) -> Any:
        raise error

    monkeypatch.setattr(SshTransport, "put_file", failing)
    m, res = _quantize_on_box(tmp_path)
    st = RunManifest.load(m.run_dir).stage("quantize")
    assert not res.ok and st.state == "failed"
    out = st.data["outcome"]
    assert out["code"] == code and str(error) in out["message"], out
    assert ("df -h" in (out["hint"] or "")) == hint_has_df, out


def test_a_worker_left_running_by_a_dropped_attempt_blocks_the_next(tmp_path: Path) -> None:
    """A connection that dropped half-open leaves the worker running on the host until sshd notices (minutes).
    The attempt noted it; the next attempt on that host checks it has ended before starting another (which
    would share its memory and its output folder), and goes ahead, the note removed, once it has."""
    import subprocess

    root = tmp_path / "host-root"
    spec = f"{tmp_path}/host-root/runs/x/specs/quantize-123.json"
    # the earlier attempt's worker, on the host (this machine: the sshd is on loopback), its own process group
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", spec], start_new_session=True
    )
    try:
        with SshServer(tmp_path / "sshd") as srv:
            _add_host(srv, root)
            m = Workspace(tmp_path / "ws").create_run("builtin:tiny-llama", "sim", {"worker_host": "box"})
            note = m.run_dir / "logs" / "quantize.host-worker.json"
            note.parent.mkdir(parents=True, exist_ok=True)
            note.write_text(json.dumps({"host": "box", "pid": worker.pid, "spec": spec}))
            res = asyncio.run(Pipeline(m, stages=_stages()).run(until="quantize"))
            out = RunManifest.load(m.run_dir).stage("quantize").data["outcome"]
            assert not res.ok and out["code"] == "worker_host_busy", out
            assert f"kill -- -{worker.pid}" in (out["hint"] or "") and note.exists()
            worker.kill()
            worker.wait(10)
            m = Workspace(tmp_path / "ws").open_run(m.run_id)
            res = asyncio.run(Pipeline(m, stages=_stages()).run(until="quantize"))
            assert res.ok, res
            assert not note.exists()
    finally:
        worker.kill()
        worker.wait(10)


def test_a_link_that_drops_while_the_output_comes_home_resumes_with_the_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker finished on the host (hours of quantization, at 8B) and the link dropped while its output came
    home. The resume brings that output home without running the worker again, and records what the worker
    said (its metrics, artifacts); a note for other inputs is not trusted, and the stage runs again."""
    from hexstudio.core.device.transport import ConnectionLost
    from hexstudio.core.remote import stage as remote_stage

    real_download = remote_stage.download_tree
    drops = [1]

    async def dropping(*a: Any, **kw: Any) -> Any:
        if drops:
            drops.pop()
            raise ConnectionLost("The SSH connection to box dropped (test).")
        return await real_download(*a, **kw)

    monkeypatch.setattr(remote_stage, "download_tree", dropping)
    root = tmp_path / "host-root"
    with SshServer(tmp_path / "sshd") as srv:
        _add_host(srv, root)
        m = Workspace(tmp_path / "ws").create_run(
            "builtin:tiny-llama", "sim", {"worker_host": "box", "seconds": 1}
        )
        res = asyncio.run(Pipeline(m, stages=_stages()).run(until="quantize"))
        st = RunManifest.load(m.run_dir).stage("quantize")
        assert not res.ok and st.data["outcome"]["code"] == "worker_host_disconnected", st.data["outcome"]
        rrun = root / "runs" / m.run_id
        note = rrun / "artifacts" / "quantize.finished.json"
        assert note.is_file() and (rrun / "artifacts" / "quantize.partial" / "selftest.json").is_file()
        assert len(list(root.glob("workers-*/specs/quantize-*.json"))) == 1

        res = asyncio.run(Pipeline(RunManifest.load(m.run_dir), stages=_stages()).run(until="quantize"))
        assert res.ok, (res.message, res.hint)
        # the worker did not run again: still one spec on the host, and the log says why
        assert len(list(root.glob("workers-*/specs/quantize-*.json"))) == 1
        st = RunManifest.load(m.run_dir).stage("quantize")
        assert st.state == "done" and st.metric_value("memory_bytes") > 0
        assert st.data["peak_rss_bytes"] > 5 * 2**20  # the host's peak from the attempt that ran it
        assert (m.run_dir / "artifacts" / "quantize" / "selftest.json").is_file()
        assert any("not made again" in str(ev.get("message")) for ev in _events(m, "quantize"))
        assert not note.exists() and (rrun / "artifacts" / "quantize" / "selftest.json").is_file()

        # a note left for other inputs (the settings changed since) is not the output of this stage
        (rrun / "artifacts" / "quantize.partial").mkdir()
        note.write_text(json.dumps({"input_hash": "other", "back": [], "events": [], "peak_rss": 0}))
        res = asyncio.run(
            Pipeline(RunManifest.load(m.run_dir), stages=_stages()).run(only="quantize", force=True)
        )
        assert res.ok and len(list(root.glob("workers-*/specs/quantize-*.json"))) == 2


def test_a_link_that_drops_after_the_download_leaves_the_stage_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renaming the host's output into the stage's folder there only saves the next stage an upload: a link that
    drops at that moment leaves the stage done here, not failed and run again."""
    from hexstudio.core.device.transport import ConnectionLost
    from hexstudio.core.remote import stage as remote_stage

    real_files = remote_stage.host_files

    async def dropping(t: Any, python: str, mode: str, *a: Any, **kw: Any) -> Any:
        if mode == "promote":
            raise ConnectionLost("The SSH connection to box dropped (test).")
        return await real_files(t, python, mode, *a, **kw)

    monkeypatch.setattr(remote_stage, "host_files", dropping)
    m, res = _quantize_on_box(tmp_path)
    assert res.ok, (res.message, res.hint)
    assert RunManifest.load(m.run_dir).stage("quantize").state == "done"


def test_a_note_for_other_inputs_goes_when_the_output_is_emptied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished stage's note (its download dropped) was kept while an attempt with other settings emptied the
    output and failed: set back to the first settings, the note matched again, and its events were replayed over
    an empty output folder. The note goes before the output is emptied."""
    from hexstudio.core.device.transport import ConnectionLost
    from hexstudio.core.jobs import JobResult
    from hexstudio.core.remote import stage as remote_stage

    async def dropping(*a: Any, **kw: Any) -> Any:
        raise ConnectionLost("The SSH connection to box dropped (test).")

    root = tmp_path / "host-root"
    with SshServer(tmp_path / "sshd") as srv:
        _add_host(srv, root)
        m = Workspace(tmp_path / "ws").create_run("builtin:tiny-llama", "sim", {"worker_host": "box"})
        with monkeypatch.context() as mp:
            mp.setattr(remote_stage, "download_tree", dropping)
            assert not asyncio.run(Pipeline(m, stages=_stages()).run(until="quantize")).ok
        note = root / "runs" / m.run_id / "artifacts" / "quantize.finished.json"
        assert note.is_file()

        async def failing(self: Any, *a: Any, **kw: Any) -> Any:
            return JobResult("failed", 1, None, "failed (test)"), []

        m = RunManifest.load(m.run_dir)
        m.settings["seconds"] = 0.1  # other inputs: the note is not theirs
        m.save()
        monkeypatch.setattr(remote_stage.RemoteStageJob, "_run_there", failing)
        assert not asyncio.run(Pipeline(m, stages=_stages()).run(until="quantize")).ok
        assert not note.exists()


def test_a_users_text_already_on_the_host_is_not_sent_again(tmp_path: Path) -> None:
    """A user's calibration text was sent whole on every attempt (put_file continues only a .part), and its whole
    size counted as sent: the resume hint's "files already on the host are not sent again" held for every file
    but these."""
    text = tmp_path / "cal.txt"
    text.write_text("the text the model is calibrated on\n" * 2000)
    root = tmp_path / "host-root"
    with SshServer(tmp_path / "sshd") as srv:
        _add_host(srv, root)
        m = Workspace(tmp_path / "ws").create_run(
            "builtin:tiny-llama", "sim", {"worker_host": "box", "calibration_text": str(text)}
        )
        assert asyncio.run(Pipeline(m, stages=_stages()).run(until="quantize")).ok
        st = RunManifest.load(m.run_dir).stage("quantize")
        assert st.metric_value("worker_host_upload_bytes") >= text.stat().st_size
        assert (
            root / "runs" / m.run_id / "inputs" / "calibration_text" / "cal.txt"
        ).read_bytes() == text.read_bytes()
        res = asyncio.run(
            Pipeline(RunManifest.load(m.run_dir), stages=_stages()).run(only="quantize", force=True)
        )
        assert res.ok
        st = RunManifest.load(m.run_dir).stage("quantize")
        assert st.metric_value("worker_host_upload_bytes") == 0, st.metric_value("worker_host_upload_bytes")
        text.write_text("edited since\n" * 100)  # another text: sent again
        res = asyncio.run(
            Pipeline(RunManifest.load(m.run_dir), stages=_stages()).run(only="quantize", force=True)
        )
        assert (
            res.ok
            and RunManifest.load(m.run_dir).stage("quantize").metric_value("worker_host_upload_bytes") > 0
        )
