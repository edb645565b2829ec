"""Bundle push over a real sshd: byte-level progress (throttled, on the event loop) with MB/s over the bytes
really sent; EMULATED bundles refused on a real board unless the board allows them; a dropped connection
gets its own error (code push_interrupted in the Board stage) with the resume hint."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device import push as push_mod
from hexstudio.core.device import transport as tr
from hexstudio.core.device.board import open_board, sim_board
from hexstudio.core.device.errors import EmulatedBundle
from hexstudio.core.device.push import PushProgress, push_bundle
from tests.board.conftest import settings_with
from tests.support.evk_board import make_device_bundle
from tests.support.sshd import SshServer

FACTS = {
    "dsp_arch": "v73",
    "qairt_version": "2.45.0.260326",
    "mem_total_bytes": 16 << 30,
    "mem_available_bytes": 12 << 30,
}


def _cfg(srv: SshServer, **extra: Any) -> dict[str, Any]:
    return srv.key_config(**extra)


def _emulated(bundle: Path) -> Path:
    doc = json.loads((bundle / "bundle.json").read_text())
    doc["emulated"] = True
    (bundle / "bundle.json").write_text(json.dumps(doc))
    return bundle


@pytest.mark.slow
def test_byte_progress_is_throttled_and_the_rate_counts_only_sent_bytes(
    ssh_server: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a fast machine sends 64 MiB over loopback in well under 0.2 s (CI did: one event inside the file), so
    # the throttle is narrowed: the test is about events inside a file and their spacing, not about 0.1 s
    interval = 0.01
    monkeypatch.setattr(push_mod, "PROGRESS_INTERVAL_S", interval)
    settings = settings_with("root", _cfg(ssh_server))
    bundle = make_device_bundle(tmp_path / "bundle", parts=1, part_bytes=64 << 20)
    big = "evk_model_part_1_of_1.bin"
    size = (bundle / big).stat().st_size

    async def go() -> tuple[list[PushProgress], list[PushProgress], Any, Any]:
        board = await open_board("root", settings, trust=lambda *a: True)
        loop_thread = threading.get_ident()
        first: list[PushProgress] = []
        second: list[PushProgress] = []

        def on_first(p: PushProgress) -> None:
            assert threading.get_ident() == loop_thread  # delivered on the event loop, not SFTP's thread
            first.append(p)

        r1 = await push_bundle(board, bundle, "progress-test", on_first, facts=FACTS)
        # the board loses the big file: a re-push skips the rest and sends only that one
        await board.transport.run(["rm", "-f", "--", f"{r1.remote_dir}/{big}"])
        r2 = await push_bundle(board, bundle, "progress-test", second.append, facts=FACTS)
        await board.transport.run(["rm", "-rf", "--", r1.remote_dir])
        await board.transport.close()
        return first, second, r1, r2

    first, second, r1, r2 = asyncio.run(go())

    # byte-level: events inside the 64 MiB file, not only one per file
    inside = [p for p in first if p.file == big and 0 < p.file_done < size]
    assert len(inside) >= 2, [(p.file, p.file_done) for p in first]
    assert all(b.done >= a.done for a, b in itertools.pairwise(first))
    gaps = [b.seconds - a.seconds for a, b in itertools.pairwise(inside)]
    assert min(gaps) >= interval * 0.9  # throttled: never closer than the interval
    assert first[-1].done == first[-1].total and first[-1].sent == r1.sent_bytes

    # the resumed push: MB/s is over the bytes really sent, never over the skipped ones
    assert r2.sent_files == 1 and r2.skipped_files == r1.sent_files - 1 and r2.sent_bytes == size
    last = second[-1]
    assert (last.done, last.sent) == (last.total, size) and last.total > size
    assert last.mb_per_s == pytest.approx(size / 1e6 / last.seconds)
    assert all(p.sent <= size for p in second)
    before = second[: next(i for i, p in enumerate(second) if p.file == big)]
    assert before and all(p.sent == 0 for p in before)  # skipped files count as done, not as sent


def test_an_emulated_bundle_is_refused_on_a_real_board(ssh_server: SshServer, tmp_path: Path) -> None:
    bundle = _emulated(make_device_bundle(tmp_path / "emu", part_bytes=100))
    settings = settings_with("root", _cfg(ssh_server))

    async def refused() -> None:
        board = await open_board("root", settings, trust=lambda *a: True)
        with pytest.raises(EmulatedBundle) as ei:
            await push_bundle(board, bundle, "emu", facts=FACTS)
        assert "EMULATOR" in ei.value.message and "not QNN context binaries" in ei.value.message
        assert "real Qualcomm AI Hub" in (ei.value.hint or "")
        assert not await board.transport.exists(f"{await board.transport.home()}/hexstudio/bundles/emu")
        await board.transport.close()

    asyncio.run(refused())

    # a test board that explicitly allows it: pushed, and labeled EMULATED in the result
    settings = settings_with("root-test", _cfg(ssh_server, allow_emulated_bundles=True))

    async def allowed() -> None:
        board = await open_board("root-test", settings, trust=lambda *a: True)
        r = await push_bundle(board, bundle, "emu", facts=FACTS)
        assert r.emulated is True and any("EMULATED" in w for w in r.warnings) and r.sent_files == 7
        await board.transport.run(["rm", "-rf", "--", r.remote_dir])
        await board.transport.close()

    asyncio.run(allowed())


def _sim_bundle(path: Path) -> Path:
    make_device_bundle(path, part_bytes=1000)
    doc = json.loads((path / "bundle.json").read_text())
    doc.update(simulated=True, device={"name": "HexStudio simulator", "soc_model": 0, "dsp_arch": "sim"})
    (path / "bundle.json").write_text(json.dumps(doc))
    return path


def test_a_dropped_connection_in_the_board_stage_has_its_own_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hexstudio.core.device.stage import run_board_stage
    from hexstudio.core.runs import Workspace
    from hexstudio.core.stage_api import StageContext, StageError
    from hexstudio.core.stages import get_stage

    ws = Workspace(tmp_path / "ws")
    m = ws.create_run("builtin:tiny-llama", "sim")
    upstream = tmp_path / "compile"
    _sim_bundle(upstream / "bundle")
    calls = {"n": 0}
    orig = tr.LocalTransport.put_file

    async def dropping(self: tr.LocalTransport, local: Path, remote: str, progress: Any = None) -> int | None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise tr.ConnectionLost("the SSH connection dropped")
        return await orig(self, local, remote, progress)

    monkeypatch.setattr(tr.LocalTransport, "put_file", dropping)
    monkeypatch.setattr(
        "hexstudio.core.device.stage.open_board", lambda name, s, w: _async(sim_board(tmp_path / "simws"))
    )
    out = m.run_dir / "artifacts" / "board.partial"
    out.mkdir(parents=True)
    events: list[dict[str, Any]] = []
    ctx = StageContext(m, get_stage("board"), out, {"compile": upstream}, events.append, asyncio.Event())
    with pytest.raises(StageError) as ei:
        asyncio.run(run_board_stage(ctx))
    assert ei.value.code == "push_interrupted" and "dropped" in ei.value.message
    assert "push again" in (ei.value.hint or "") and "skipped" in (ei.value.hint or "")
    # pushing again resumes: the two files sent before the drop are skipped
    monkeypatch.setattr(tr.LocalTransport, "put_file", orig)
    events.clear()
    doc = asyncio.run(run_board_stage(ctx))
    assert doc["simulated"] is True
    board_json = json.loads((out / "board.json").read_text())
    assert board_json["push"]["skipped_files"] == 2 and board_json["emulated_bundle"] is False
    pushes = [e for e in events if e.get("type") == "progress" and "bytes_sent" in e]
    assert pushes and pushes[-1]["bytes_done"] == pushes[-1]["bytes_total"]
    assert pushes[-1]["bytes_sent"] < pushes[-1]["bytes_total"]  # the skipped files are not "sent"


async def _async(v: Any) -> Any:
    return v
