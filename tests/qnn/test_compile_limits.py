"""A local compile that runs past its time limit is a failure that says so, with QNN's log so far kept; not an
uncaught TimeoutExpired reported as "a HexStudio bug" with no log."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from hexstudio.workers.qnn import compile as qnn_compile
from hexstudio.workers.qnn.ep import HtpTarget


def test_a_compile_past_its_limit_is_stopped_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = tmp_path / "python"
    slow.write_text("#!/bin/sh\necho 'QnnDsp <I> preparing graph part_1_of_2' >&2\nexec sleep 30\n")
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(qnn_compile, "find_qnn_libs", lambda: SimpleNamespace(python=str(slow)))
    graphs = [
        qnn_compile.GraphToCompile("prompt_ar128_cl512_1_of_2", "prompt_processor", 1, 2, tmp_path / "g.onnx")
    ]
    out = tmp_path / "ctx"
    with pytest.raises(qnn_compile.LocalCompileError) as err:
        qnn_compile.compile_part(graphs, out, HtpTarget(77, "v73"), shared=False, timeout=1.0)
    assert err.value.code == "local_compile_timeout" and "ran past its limit" in err.value.message
    assert "compile.log" in (err.value.hint or "")
    assert "preparing graph part_1_of_2" in (out / "compile.log").read_text()
