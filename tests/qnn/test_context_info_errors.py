"""Reading a file back through libQnnSystem maps it (a part's binary is gigabytes at 8B: read into memory and copied
into a ctypes buffer, it was held twice). A file QNN cannot read still says so, with the mapping closed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hexstudio.workers.qnn.context_info import ContextInfoError, read_context_info
from hexstudio.workers.qnn.libs import find_qnn_libs
from tests.qnn.conftest import needs_qnn

pytestmark = [needs_qnn]


@pytest.mark.parametrize(
    ("content", "words"), [(os.urandom(4096), "is not a QNN context binary"), (b"", "is empty")]
)
def test_a_file_qnn_cannot_read_is_said_and_left_closed(tmp_path: Path, content: bytes, words: str) -> None:
    libs = find_qnn_libs()
    assert libs is not None
    f = tmp_path / "part_1_of_1.bin"
    f.write_bytes(content)
    with pytest.raises(ContextInfoError) as err:  # not a BufferError from a mapping a traceback kept open
        read_context_info(f, libs.system)
    assert f"{f.name} {words}" in str(err.value)
    f.unlink()
