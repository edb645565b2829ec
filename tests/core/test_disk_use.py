"""tree_bytes: what a stage folder takes on disk, each hard-linked file once."""

from __future__ import annotations

import os
from pathlib import Path

from hexstudio.shared.disk_use import tree_bytes


def test_a_hard_linked_file_counts_once_and_sizes_differ_from_blocks(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "w.bin").write_bytes(b"x" * 10_000)
    os.link(tmp_path / "a" / "w.bin", tmp_path / "w-linked.bin")  # as a run links an unchanged input
    (tmp_path / "small.txt").write_bytes(b"y" * 10)
    with open(tmp_path / "sparse.bin", "wb") as fh:  # 1 MiB with nothing written: a hole
        fh.truncate(1 << 20)

    assert tree_bytes(tmp_path) == 10_000 + 10 + (1 << 20)
    blocks = sum(os.lstat(tmp_path / p).st_blocks * 512 for p in ("a/w.bin", "small.txt", "sparse.bin"))
    assert tree_bytes(tmp_path, allocated=True) == blocks
    assert tree_bytes(tmp_path, allocated=True) < tree_bytes(tmp_path)  # the hole takes no blocks
    assert tree_bytes(tmp_path / "missing") == 0
