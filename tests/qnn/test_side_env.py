"""The installer's side environment for Qualcomm's runtime (hexstudio.workers.qnn.libs): where the main venv
cannot hold onnxruntime-qnn (the validated GPU recipe, Python 3.10), `<venv>/.hexstudio-qnn` names the side venv's
python. A venv's bin/python is a link to the base interpreter: following it lost the venv, so the wheel the
installer had put there was never found."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hexstudio.workers.qnn import libs


def test_the_side_venv_is_found_through_its_python_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    side = tmp_path / "venv-qnn"
    (side / "bin").mkdir(parents=True)
    (side / "bin" / "python").symlink_to(sys.executable)  # as `python -m venv` makes it
    pkg = side / "lib" / "python3.12" / "site-packages" / libs.PACKAGE
    pkg.mkdir(parents=True)
    for name in ("libGenie.so", "libQnnHtp.so", "libQnnSystem.so"):
        (pkg / name).write_bytes(b"\x7fELF stand-in")
    (pkg / "build_and_package_info.py").write_text("__version__ = '2.7.0'\nqnn_version = '2.51.0'\n")
    main = tmp_path / "venv"
    main.mkdir()
    (main / libs.SIDE_ENV_MARKER).write_text(f"{side / 'bin' / 'python'}\n")
    monkeypatch.setattr(sys, "prefix", str(main))
    monkeypatch.setattr(libs, "_folder_in_this_env", lambda: None)  # the main venv cannot hold the wheel

    found = libs.find_qnn_libs()
    assert found is not None, "the side environment's wheel was not found"
    assert found.folder == pkg and found.python == str(side / "bin" / "python")
    assert (found.qnn_version, found.wheel_version) == ("2.51.0", "2.7.0") and not found.in_process
