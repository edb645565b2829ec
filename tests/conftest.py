"""Test-wide setup: never the system keyring, never the user's config or workspace, Qt offscreen."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# keyring: a plaintext file backend in a per-session temp folder (set before anything imports keyring)
os.environ["PYTHON_KEYRING_BACKEND"] = "keyrings.alt.file.PlaintextKeyring"


# The fast tier (`./dev test --fast`, the inner loop): everything but the tests that need a real quantization run
# (these session fixtures build one), an OpenSSH server, a real X display or Qualcomm's simulator at length.
HEAVY_FIXTURES = {
    "validated_run",
    "compiled_sim_run",
    "local_run",
    "eval_workspace",
    "twin_workspace",
    "sim_workspace",
    "evk_board",
    "sshd_board",
    "frozen_exe",
}
HEAVY_FOLDERS = {"quantize", "qnn", "board", "model"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = (
            Path(str(item.fspath)).relative_to(REPO / "tests").parts[0]
            if str(item.fspath).startswith(str(REPO / "tests"))
            else ""
        )
        if (
            (HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())))
            or item.get_closest_marker("slow")
            or item.get_closest_marker("sshd")
            or folder in HEAVY_FOLDERS
            or "real_display" in item.nodeid
        ):
            item.add_marker(pytest.mark.heavy)
    # The longest files first: pytest-xdist (`./dev test -n 2 --dist loadfile`) hands out whole files in this
    # order, so the long ones start early and the many short ones fill in around them, instead of one long file
    # running alone at the end while the other worker has nothing left to do. First the files with a test over a
    # minute (slow with a reason), then those with heavy tests, then the rest; the order within a file is kept.
    rank: dict[str, int] = {}
    for item in items:
        slow = item.get_closest_marker("slow")
        r = (
            0
            if slow is not None and slow.kwargs.get("reason")
            else 1
            if item.get_closest_marker("heavy")
            else 2
        )
        rank[str(item.fspath)] = min(r, rank.get(str(item.fspath), 2))
    items.sort(key=lambda item: rank[str(item.fspath)])


# No test runs over a minute without a reason written beside it (issue 30): `@pytest.mark.slow(reason="...")`
# says why it cannot be cheaper. The run's summary names every test whose call took longer without one. A minute of
# the machine alone: with N test processes sharing its cores (pytest-xdist, `./dev test` runs 2) each test gets
# about 1/N of them, so the bound is N minutes there.
SLOW_CALL_S = float(os.environ.get("HEXSTUDIO_SLOW_TEST_S", "60"))
_over_without_reason: list[tuple[str, float]] = []


def pytest_configure(config: pytest.Config) -> None:
    global SLOW_CALL_S
    n = getattr(config.option, "numprocesses", None)  # pytest-xdist's -n, in the process that reports
    if isinstance(n, int) and n > 1:
        SLOW_CALL_S *= n


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.duration > SLOW_CALL_S and "slow_reason" not in report.keywords:
        _over_without_reason.append((report.nodeid, report.duration))


def pytest_runtest_setup(item: pytest.Item) -> None:
    mark = item.get_closest_marker("slow")
    if mark is not None and mark.kwargs.get("reason"):
        item.keywords["slow_reason"] = True


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _over_without_reason:
        terminalreporter.section(f"tests over {SLOW_CALL_S:g} s without a written reason")
        for nodeid, seconds in sorted(_over_without_reason, key=lambda x: -x[1]):
            terminalreporter.write_line(
                f"{seconds:7.1f} s  {nodeid}: make it cheaper, or say why with @pytest.mark.slow(reason=...)"
            )


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HEXSTUDIO_CONFIG_DIR", str(base / "config"))
    monkeypatch.setenv("HEXSTUDIO_WORKSPACE", str(base / "workspace"))
    monkeypatch.setenv("XDG_DATA_HOME", str(base / "xdg-data"))  # PlaintextKeyring lives here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def python_exe() -> str:
    return sys.executable


# Prepared runs shared by every area (docs/CONTRACTS.md §6). Built once per test run, even when pytest-xdist runs
# it in several processes (tests/support/shared_build.py); copy the folder before changing it.
@pytest.fixture(scope="session")
def validated_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.runs import build_validated_run
    from tests.support.shared_build import built_once

    return built_once(tmp_path_factory, "validated-ws", build_validated_run)


@pytest.fixture(scope="session")
def compiled_sim_run(validated_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.shared_build import built_once
    from tests.support.sim_runs import build_compiled_sim_run

    return built_once(tmp_path_factory, "compiled-ws", lambda ws: build_compiled_sim_run(validated_run, ws))
