"""GenieX board setup on the EVK test board: the doctor finds it missing, then too old for the bundle (its QAIRT
plugin older than the QAIRT that compiled it), and the Fix installs or updates it from a release tarball the user
provides (no internet on the board): commands shown first, idempotent, re-checked."""

from __future__ import annotations

import asyncio
import io
import tarfile
from pathlib import Path

import pytest

from hexstudio.core.device.board import open_board
from hexstudio.core.device.doctor import geniex_versions, probe
from hexstudio.core.device.fixes import apply_fix, plan_fix
from tests.board.conftest import settings_with
from tests.support.evk_board import EvkBoard, make_device_bundle

GENIEX = r"""#!/bin/sh
# GenieX CLI stand-in (test): answers `geniex version` as cli/cmd/geniex/version.go prints it.
for a in "$@"; do case "$a" in version|-v|--version) v=1 ;; esac; done
[ -n "$LD_LIBRARY_PATH" ] || { echo "error while loading shared libraries: libgeniex.so" >&2; exit 127; }
if [ -n "$v" ]; then
  printf '%-23s %s\n' "GenieX CLI Version:" "@CLI@"
  printf '%-23s %s\n' "QAIRT Runtime Version:" "@QAIRT@"
  printf '%-23s %s\n' "LlamaCPP Runtime Hash:" "4ff829e"
  exit 0
fi
echo "Usage: geniex [command]"
"""


def geniex_tarball(folder: Path, cli: str, qairt: str) -> Path:
    """A release tarball shaped like GenieX's (a top folder geniex-cli-linux-arm64-<tag>/ holding the binary)."""
    path = folder / f"geniex-cli-linux-arm64-{cli}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for name, data, mode in (
            (
                f"geniex-cli-linux-arm64-{cli}/geniex",
                GENIEX.replace("@CLI@", cli).replace("@QAIRT@", qairt).encode(),
                0o755,
            ),
            (f"geniex-cli-linux-arm64-{cli}/libgeniex.so", b"\x7fELF stand-in" * 100, 0o644),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tf.addfile(info, io.BytesIO(data))
    return path


def test_geniex_versions_parse() -> None:
    text = "GenieX CLI Version:     v0.7.0\nQAIRT Runtime Version:  v2.45.0.260326\nLlamaCPP Runtime Hash:  4ff829e\n"
    assert geniex_versions(text) == {
        "cli": "v0.7.0",
        "qairt_plugin": "v2.45.0.260326",
        "llama_cpp": "4ff829e",
    }


@pytest.fixture(scope="module")
def evk_geniex(tmp_path_factory: pytest.TempPathFactory):
    with EvkBoard(tmp_path_factory.mktemp("evk-geniex"), fastrpc_ready=True) as b:
        yield b


def test_doctor_and_fix_for_geniex(evk_geniex: EvkBoard, tmp_path: Path) -> None:
    settings = settings_with("evk-gx", {**evk_geniex.board_config(), "runtime": "geniex"})
    bundle = make_device_bundle(tmp_path / "bundle", qairt="2.45.0.260326154327")
    old = geniex_tarball(tmp_path, "v0.6.0", "v2.42.0.251225")
    new = geniex_tarball(tmp_path, "v0.7.0", "v2.45.0.260326")

    async def flow() -> None:
        board = await open_board("evk-gx", settings, trust=lambda *a: True)
        # 1. missing: the board's runtime is geniex, so the doctor fails it and offers the fix
        c = (await probe(board, only=["geniex"])).by_id("geniex")
        assert c.status == "fail" and c.fix == "geniex_install" and "not installed" in c.message, c
        # 2. the fix from an old release: shown commands, no sudo, then re-checked: too old for the bundle
        plan = await plan_fix(board, "geniex_install", geniex_file=old)
        assert not plan.needs_sudo
        assert any("tar -xzf" in cmd for cmd in plan.commands) and any(
            old.name in cmd for cmd in plan.commands
        )
        res = await apply_fix(board, plan)
        assert res.status == "applied", res.message
        rep = await probe(board, only=["geniex"], bundle=(bundle, "b"))
        c = rep.by_id("geniex")
        assert (
            c.status == "fail" and "v2.42.0.251225" in c.message and "older than the QAIRT 2.45" in c.message
        ), c
        assert rep.facts["geniex"]["cli"] == "v0.6.0"
        # 3. the fix again with the new release updates it in place; the bundle's QAIRT is now covered
        res = await apply_fix(board, await plan_fix(board, "geniex_install", geniex_file=new))
        assert res.status == "applied", res.message
        c = (await probe(board, only=["geniex"], bundle=(bundle, "b"))).by_id("geniex")
        assert "v0.7.0" in c.message and "v2.45.0.260326" in c.message, c
        # the Python package is what is left (HexStudio's helper keeps the model loaded with it)
        assert c.status == "warn" and "Python package" in c.message, c
        # 4. idempotent: the same file again sends and unpacks nothing
        again = await apply_fix(board, await plan_fix(board, "geniex_install", geniex_file=new), rerun=False)
        assert again.status == "already" and all(e.get("skipped") for e in again.log), again.log
        # the launcher is GenieX's: the binary finds its libraries through LD_LIBRARY_PATH
        r = await board.transport.run(["sh", "-c", "$HOME/.local/bin/geniex version"])
        assert r.exit_status == 0 and "v0.7.0" in r.stdout, r
        await board.transport.close()

    asyncio.run(flow())


def test_a_damaged_release_file_is_refused_before_anything_is_sent(
    evk_geniex: EvkBoard, tmp_path: Path
) -> None:
    from hexstudio.core.device.errors import BoardError

    settings = settings_with("evk-gx2", evk_geniex.board_config())
    f = geniex_tarball(tmp_path, "v0.7.0", "v2.45.0.260326")
    f.with_name(f.name + ".sha256").write_text("0" * 64 + f"  {f.name}\n")

    async def flow() -> None:
        board = await open_board("evk-gx2", settings, trust=lambda *a: True)
        with pytest.raises(BoardError, match="does not match its"):
            await plan_fix(board, "geniex_install", geniex_file=f)
        # a board whose runtime is genie: GenieX is optional (skipped when absent, a warning when incomplete)
        c = (await probe(board, only=["geniex"])).by_id("geniex")
        assert c.status in ("skip", "warn", "ok") and c.fix == "geniex_install", c
        await board.transport.close()

    asyncio.run(flow())
