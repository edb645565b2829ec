"""The GUI process starts without the ML stack: torch, aimet_onnx, onnxruntime and transformers
are imported only by worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app.ui.launch import HEAVY_MODULES


def test_gui_process_never_imports_the_ml_stack(tmp_path: Path, compiled_sim_run: Path) -> None:
    from tests.support.sim_runs import copy_run

    run = copy_run(compiled_sim_run, tmp_path / "ws")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HEXSTUDIO_CONFIG_DIR": str(tmp_path / "cfg")}
    # open the prepared run so every page renders its results, then visit each page
    script = (
        "import sys, json\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication([])\n"
        "from app.core.runs import Workspace\n"
        "from app.ui.controller import RunController\n"
        "from app.ui.main_window import MainWindow\n"
        "from app.ui.launch import heavy_modules_loaded\n"
        f"c = RunController(Workspace({str(tmp_path / 'ws')!r}))\n"
        "w = MainWindow(c); w.show()\n"
        f"c.open_run({run.name!r})\n"
        "for i in range(w.stage_list.count()):\n"
        "    w.stage_list.setCurrentRow(i); app.processEvents()\n"
        "print(json.dumps({'heavy': heavy_modules_loaded(), 'states': {s: c.state(s) for s in w.pages}}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["heavy"] == [], f"the GUI imported {doc['heavy']}"
    assert doc["states"]["compile"] == "done"
    assert set(HEAVY_MODULES) >= {"torch", "aimet_onnx", "onnxruntime", "transformers"}


def test_startup_check_opens_the_window(tmp_path: Path) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HEXSTUDIO_CONFIG_DIR": str(tmp_path / "cfg")}
    out = subprocess.run([sys.executable, "-m", "app", "gui", "--startup-check", "--workspace", str(tmp_path / "ws")],
                         env=env, capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["title"] == "HexStudio" and doc["heavy_modules"] == [] and doc["first_window_s"] > 0


def test_no_display_is_a_clear_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    out = subprocess.run([sys.executable, "-m", "app"], env=env, capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 2 and "no display" in out.stderr and "WSLg" in out.stderr
