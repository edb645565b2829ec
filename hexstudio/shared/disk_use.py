"""How much disk a folder of stage outputs takes (standard library only)."""

from __future__ import annotations

import os
from pathlib import Path


def tree_bytes(root: str | Path, *, allocated: bool = False) -> int:
    """Bytes the files under `root` take, each hard-linked file once (a run links its unchanged inputs).

    By default the files' sizes, as an upload or a copy would carry them. With `allocated`, the blocks the file
    system gave them, as `du` counts (a sparse file takes less; a small file takes a whole block)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            st = os.lstat(os.path.join(dirpath, f))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512 if allocated else st.st_size
    return total
