"""The GUI process starts without the ML stack: torch, aimet_onnx, onnxruntime and transformers
are imported only by worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hexstudio.ui.launch import HEAVY_MODULES


def test_gui_process_never_imports_the_ml_stack(tmp_path: Path, compiled_sim_run: Path) -> None:
    from tests.support.sim_runs import copy_run

    run = copy_run(compiled_sim_run, tmp_path / "ws")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HEXSTUDIO_CONFIG_DIR": str(tmp_path / "cfg")}
    # open the prepared run so every page renders its results, then visit each page
    script = (
        "import sys, json\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication([])\n"
        "from hexstudio.core.runs import Workspace\n"
        "from hexstudio.ui.controller import RunController\n"
        "from hexstudio.ui.main_window import MainWindow\n"
        "from hexstudio.ui.launch import heavy_modules_loaded\n"
        f"c = RunController(Workspace({str(tmp_path / 'ws')!r}))\n"
        "w = MainWindow(c); w.show()\n"
        f"c.open_run({run.name!r})\n"
        "for i in range(w.stage_list.count()):\n"
        "    w.stage_list.setCurrentRow(i); app.processEvents()\n"
        "print(json.dumps({'heavy': heavy_modules_loaded(), 'states': {s: c.state(s) for s in w.pages}}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["heavy"] == [], f"the GUI imported {doc['heavy']}"
    assert doc["states"]["compile"] == "done"
    assert set(HEAVY_MODULES) >= {"torch", "aimet_onnx", "onnxruntime", "transformers"}


# Issue 8's target is < 2 s from a cold start to the first window (docs/PERFORMANCE.md: median 0.92 s on
# this box). The bound is looser because this box is shared with other work, yet a regression such as an
# ML import at startup (torch alone takes several seconds) still fails it. The best of two fresh processes
# is compared, so one unlucky scheduling hiccup does not fail the suite.
COLD_START_BOUND_S = 4.0


def _startup_check(tmp_path: Path) -> tuple[float, dict[str, object]]:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HEXSTUDIO_CONFIG_DIR": str(tmp_path / "cfg")}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hexstudio", "gui", "--startup-check", "--workspace", str(tmp_path / "ws")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # printed on the window's first event-loop turn
    wall = time.perf_counter() - t0  # process spawn to the first window, measured from outside
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    doc: dict[str, object] = json.loads((line + rest).strip().splitlines()[0])
    return wall, doc


def test_startup_check_opens_the_window_within_the_cold_start_bound(tmp_path: Path) -> None:
    runs = [_startup_check(tmp_path) for _ in range(2)]
    for _wall, doc in runs:
        assert doc["title"] == "HexStudio" and doc["heavy_modules"] == [], doc
        assert isinstance(doc["first_window_s"], float) and doc["first_window_s"] > 0
    best_wall = min(w for w, _ in runs)
    best_inner = min(float(d["first_window_s"]) for _, d in runs)  # type: ignore[arg-type]
    assert best_inner <= best_wall + 0.05
    assert best_wall < COLD_START_BOUND_S, (
        f"cold start to the first window took {best_wall:.2f} s (best of 2; target < 2 s, test bound "
        f"{COLD_START_BOUND_S} s): something slow now runs at startup — profile with "
        "`python -X importtime -m hexstudio gui --startup-check` and keep heavy imports out of the GUI process"
    )


def test_no_display_is_a_clear_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    out = subprocess.run(
        [sys.executable, "-m", "hexstudio"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 2 and "no display" in out.stderr and "WSLg" in out.stderr


def test_a_damaged_settings_file_is_said_not_a_silent_traceback(tmp_path: Path) -> None:
    """A settings.json that is not JSON (or has a null or mistyped section) ended the studio's start in a
    traceback: started from the Start menu, no window and no word."""
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "settings.json").write_text("{broken")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HEXSTUDIO_CONFIG_DIR": str(cfg)}
    r = subprocess.run(
        [sys.executable, "-m", "hexstudio", "gui", "--startup-check", "--workspace", str(tmp_path / "ws")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "settings.json cannot be read" in r.stderr and "Fix or delete it" in r.stderr
    assert (cfg / "settings.json").read_text() == "{broken"  # nothing overwritten
