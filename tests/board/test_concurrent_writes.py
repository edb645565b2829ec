"""Two writers of one file on a board (two sessions pushing the same helper, over two SSH connections) never
leave it half-written or fail on each other's temporary file: each write has a .part of its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hexstudio.core.device.connect import connect_ssh
from hexstudio.core.device.transport import LocalTransport
from tests.support.sshd import SshServer


def test_two_ssh_connections_write_one_file_at_once(ssh_server: SshServer, tmp_path: Path) -> None:
    target = tmp_path / "bin" / "genie_session.py"
    data = b"print('the helper')\n" * 20_000  # several SFTP packets, so the writes overlap

    async def go() -> None:
        a, b = [await connect_ssh("evk-test", ssh_server.key_config(), trust=lambda *_a: True) for _ in "ab"]
        try:
            for _ in range(5):
                await asyncio.gather(
                    a.write_bytes(str(target), data, 0o755), b.write_bytes(str(target), data, 0o755)
                )
                assert target.read_bytes() == data
        finally:
            await a.close()
            await b.close()

    asyncio.run(go())
    assert target.stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in target.parent.iterdir()) == ["genie_session.py"]  # no .part left


def test_local_writes_at_once_and_a_failed_write_leaves_no_part(tmp_path: Path) -> None:
    t = LocalTransport(tmp_path)
    target = tmp_path / "bin" / "x.json"

    async def go() -> None:
        await asyncio.gather(*(t.write_bytes(str(target), b"{}" * 50_000) for _ in range(8)))

    asyncio.run(go())
    assert target.read_bytes() == b"{}" * 50_000
    (tmp_path / "bin" / "dir").mkdir()
    with pytest.raises(OSError):  # a folder stands where the file goes
        asyncio.run(t.write_bytes(str(tmp_path / "bin" / "dir"), b"x"))
    assert sorted(p.name for p in target.parent.iterdir()) == ["dir", "x.json"]


def test_a_push_whose_part_another_push_put_in_place_keeps_that_file(
    ssh_server: SshServer, tmp_path: Path
) -> None:
    """A bundle file's push goes through `<file>.part` (a dropped push continues it). When another push of the same
    file (the GUI's Board stage beside `hexstudio chat --run`) renames that .part into place first, this push's
    rename finds no .part. The file the other push put there must stay, and the error must say what happened."""
    local = tmp_path / "a.bin"
    local.write_bytes(b"x" * 300_000)
    remote = tmp_path / "board" / "a.bin"

    def other_push_finishes_first(done: int) -> None:
        if done == local.stat().st_size:
            Path(str(remote) + ".part").rename(remote)

    async def go() -> None:
        t = await connect_ssh("evk-test", ssh_server.key_config(), trust=lambda *_a: True)
        try:
            with pytest.raises(OSError) as err:
                await t.put_file(local, str(remote), other_push_finishes_first)
            assert "another push of the same bundle" in str(err.value), err.value
        finally:
            await t.close()

    asyncio.run(go())
    assert remote.read_bytes() == local.read_bytes()
