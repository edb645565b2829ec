"""Board trust (issue 27 #7), on the simulator board: what the board says about itself is not believed. A flipped
byte hidden by editing the board's manifest (its recorded ctime) is still found, by the ctime this studio recorded
after its push; a chat or evaluate session on a bundle pushed earlier (the Board stage skipped on a resume)
re-checks it first and sends what changed; a symlinked folder on the board is refused, nothing written through
it; `board probe --bundle RUN/artifacts/compile/bundle` compares the bundle the Board stage pushed (its run id)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from hexstudio.core.device.board import sim_board
from hexstudio.core.device.errors import UnsafeBundle
from hexstudio.core.device.push import REMOTE_MANIFEST, push_bundle, recheck_pushed
from hexstudio.core.device.verify import CTIMES, default_remote_name
from tests.board.test_crafted_bundle import _flip, _tree, sim_bundle


def _ctimes_now(remote: Path, rels: list[str]) -> dict[str, str]:
    """The ctimes as the push reads them on the board (`stat -c %.9Z`)."""
    out = subprocess.run(
        ["stat", "-c", "%.9Z", *[str(remote / r) for r in rels]], capture_output=True, text=True, check=True
    ).stdout.split()
    return dict(zip(rels, out, strict=True))


def test_an_edited_board_manifest_does_not_hide_a_flipped_byte(tmp_path: Path) -> None:
    bundle = sim_bundle(tmp_path / "bundle")
    board = sim_board(tmp_path / "ws")
    remote = Path(asyncio.run(push_bundle(board, bundle, "trust")).remote_dir)
    _flip(remote / "sim" / "a.onnx")
    # whoever flipped it also writes the file's new ctime into the board's manifest, as if the push had seen it
    man = remote / REMOTE_MANIFEST
    doc = json.loads(man.read_text())
    doc[CTIMES] = {**doc.get(CTIMES, {}), **_ctimes_now(remote, ["sim/a.onnx"])}
    man.write_text(json.dumps(doc))
    res = asyncio.run(push_bundle(board, bundle, "trust"))
    assert [r["path"] for r in res.resent] == ["sim/a.onnx"], res
    assert (remote / "sim" / "a.onnx").read_bytes() == (bundle / "sim" / "a.onnx").read_bytes()


def test_a_session_rechecks_the_bundle_it_did_not_push(tmp_path: Path) -> None:
    bundle = sim_bundle(tmp_path / "bundle")
    board = sim_board(tmp_path / "ws")
    remote = Path(asyncio.run(push_bundle(board, bundle, "trust")).remote_dir)
    assert asyncio.run(recheck_pushed(board, bundle, "trust")) == []
    _flip(remote / "tokenizer.json", 0)
    bad = asyncio.run(recheck_pushed(board, bundle, "trust"))
    assert [b["path"] for b in bad] == ["tokenizer.json"] and "sha256" in bad[0]["why"], bad


def test_a_recompiled_bundle_of_the_same_sizes_is_not_taken_for_the_pushed_one(tmp_path: Path) -> None:
    """The Compile stage run again (same model, same settings) gives files of the same sizes with other bytes.
    The board's copy did not change, so its ctimes still match the record; the sha256 bundle.json now asks for
    does not, and the session's recheck must say so rather than chat with the old bundle."""
    bundle = sim_bundle(tmp_path / "bundle")
    board = sim_board(tmp_path / "ws")
    remote = Path(asyncio.run(push_bundle(board, bundle, "trust")).remote_dir)
    assert asyncio.run(recheck_pushed(board, bundle, "trust")) == []
    _flip(bundle / "sim" / "a.onnx")
    doc = json.loads((bundle / "bundle.json").read_text())
    for f in doc["files"]:
        if f["path"] == "sim/a.onnx":
            f["sha256"] = hashlib.sha256((bundle / "sim" / "a.onnx").read_bytes()).hexdigest()
    (bundle / "bundle.json").write_text(json.dumps(doc))
    bad = asyncio.run(recheck_pushed(board, bundle, "trust"))
    assert sorted(b["path"] for b in bad) == ["bundle.json", "sim/a.onnx"], bad
    assert all("sha256" in b["why"] for b in bad), bad
    res = asyncio.run(push_bundle(board, bundle, "trust"))
    assert (
        res.sent_files >= 1
        and (remote / "sim" / "a.onnx").read_bytes() == (bundle / "sim" / "a.onnx").read_bytes()
    )
    assert asyncio.run(recheck_pushed(board, bundle, "trust")) == []


def test_a_symlinked_folder_on_the_board_is_refused(tmp_path: Path) -> None:
    bundle = sim_bundle(tmp_path / "bundle")
    board = sim_board(tmp_path / "ws")
    bundles = tmp_path / "ws" / "sim-board" / "home" / "hexstudio" / "bundles"
    bundles.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (bundles / "linked").symlink_to(outside)
    before = _tree(tmp_path, skip=tmp_path / "ws")
    with pytest.raises(UnsafeBundle) as e:
        asyncio.run(push_bundle(board, bundle, "linked"))
    assert "symbolic link" in e.value.message and "Nothing was sent" in e.value.message
    assert not any(outside.iterdir()) and _tree(tmp_path, skip=tmp_path / "ws") == before
    # a link inside an already pushed bundle folder, too
    remote = Path(asyncio.run(push_bundle(board, bundle, "inner")).remote_dir)
    (remote / "sim").rename(remote / "sim-real")
    (remote / "sim").symlink_to(outside)
    with pytest.raises(UnsafeBundle):
        asyncio.run(push_bundle(board, bundle, "inner"))
    assert not any(outside.iterdir())


def test_default_remote_name_is_the_run_id_for_a_runs_bundle(tmp_path: Path) -> None:
    run_bundle = tmp_path / "runs" / "20261127-010203-tiny-llama-ab12" / "artifacts" / "compile" / "bundle"
    assert default_remote_name(run_bundle) == "20261127-010203-tiny-llama-ab12"
    assert default_remote_name(tmp_path / "my-bundle") == "my-bundle"


def test_a_chat_session_on_a_pushed_run_resends_what_changed(tmp_path: Path) -> None:
    """The chat-target service (Chat, Evaluate, `hexstudio chat` and `serve`) on a run whose Board stage is done:
    the run's board.json is believed only after the bundle on the board is re-checked."""
    from hexstudio.core.runs import Workspace
    from hexstudio.core.services.chat_target import chat_target
    from hexstudio.core.settings import Settings

    ws = tmp_path / "ws"
    run_dir = ws / "runs" / "20261127-000000-tiny-llama-0000"
    local = sim_bundle(run_dir / "artifacts" / "compile" / "bundle")
    board = sim_board(ws)
    remote = Path(asyncio.run(push_bundle(board, local, run_dir.name)).remote_dir)
    (run_dir / "artifacts" / "board").mkdir(parents=True)
    (run_dir / "artifacts" / "board" / "board.json").write_text(
        json.dumps({"board": "sim", "remote_bundle": str(remote)})
    )
    _flip(remote / "sim" / "a.onnx.data", 7)
    said: list[str] = []

    async def session() -> None:
        t = await chat_target(
            Workspace(ws), Settings.load(), run_dir=run_dir, board="sim", bundle=None, say=said.append
        )
        assert t.remote_bundle == str(remote)
        await t.board.transport.close()

    asyncio.run(session())
    assert any("changed on" in s and "sim/a.onnx.data" in s for s in said), said
    assert (remote / "sim" / "a.onnx.data").read_bytes() == (local / "sim" / "a.onnx.data").read_bytes()
    said.clear()
    asyncio.run(session())  # as pushed now: nothing to say, nothing sent
    assert not any("changed on" in s for s in said), said


def test_a_runs_bundle_given_with_bundle_goes_under_its_run_id(tmp_path: Path) -> None:
    """`hexstudio chat --bundle RUN/artifacts/compile/bundle` pushed it to a folder named "bundle": the whole
    bundle sent again beside the Board stage's copy (under the run id), and every run's bundle into that one
    folder, over another run's files while a `serve` of it ran."""
    from hexstudio.core.runs import Workspace
    from hexstudio.core.services.chat_target import chat_target
    from hexstudio.core.settings import Settings

    ws = tmp_path / "ws"
    run_dir = ws / "runs" / "20261127-000000-tiny-llama-0000"
    local = sim_bundle(run_dir / "artifacts" / "compile" / "bundle")
    board = sim_board(ws)
    pushed = Path(asyncio.run(push_bundle(board, local, default_remote_name(local))).remote_dir)
    said: list[str] = []

    async def session() -> str:
        t = await chat_target(
            Workspace(ws), Settings.load(), run_dir=None, board="sim", bundle=str(local), say=said.append
        )
        await t.board.transport.close()
        return t.remote_bundle

    assert Path(asyncio.run(session())) == pushed and pushed.name == run_dir.name
    assert not (pushed.parent / "bundle").exists()


def test_a_runs_bundle_is_not_pushed_while_the_run_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hexstudio board push` of a run's bundle took no run lock: beside the run's own Board stage both wrote into one
    .part of each file, and a Compile run again replaced the folder under the push."""
    from hexstudio.cli.main import main as cli
    from hexstudio.core.runs import RunLock, Workspace

    ws = tmp_path / "ws"
    monkeypatch.setenv("HEXSTUDIO_WORKSPACE", str(ws))  # the simulator board lives in the workspace
    m = Workspace(ws).create_run("builtin:tiny-llama", "sim")
    bundle = m.run_dir / "artifacts" / "compile" / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "bundle.json").write_text('{"files": []}')
    with RunLock(m.run_dir):  # the run's own stage, pushing or compiling
        rc = cli(["board", "push", "sim", str(bundle)])
    err = capsys.readouterr().err
    assert rc != 0 and f"Run {m.run_id} is working" in err and "push again" in err, err
