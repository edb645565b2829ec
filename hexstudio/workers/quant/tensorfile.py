"""A float32 safetensors file written tensor by tensor, block by block: the header first (from the
shapes), then each tensor's bytes from a generator, so only one block is in memory at a time."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np


def write_f32_tensors(
    path: Path, shapes: dict[str, list[int]], blocks: Callable[[str], Iterable[np.ndarray]]
) -> None:
    """Write `path` (atomically, via `<path>.partial`): every tensor of `shapes`, in order, from
    `blocks(name)` (float32 arrays whose bytes, concatenated, are the tensor in row-major order)."""
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in shapes.items():
        n = 4 * int(np.prod(shape, dtype=np.int64))
        header[name] = {
            "dtype": "F32",
            "shape": [int(d) for d in shape],
            "data_offsets": [offset, offset + n],
        }
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * ((-len(head)) % 8)
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as fh:
            fh.write(len(head).to_bytes(8, "little"))
            fh.write(head)
            for name in shapes:
                start = fh.tell()
                for block in blocks(name):
                    fh.write(memoryview(np.ascontiguousarray(block, dtype=np.float32)))
                written = fh.tell() - start
                a, b = header[name]["data_offsets"]
                if written != b - a:
                    raise ValueError(f"{name}: wrote {written} bytes for a tensor of shape {shapes[name]}")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
