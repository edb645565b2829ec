"""Start the studio window on a qasync event loop."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from hexstudio.core import logs
from hexstudio.shared.errors import ActionableError

# The GUI process stays light: these are imported only by worker processes (qai_hub: by the AI Hub
# compile worker and the device-list worker the Compile page starts, hexstudio/workers/aihub_devices.py).
HEAVY_MODULES = ("torch", "aimet_onnx", "onnxruntime", "transformers", "onnx", "qai_hub")


def heavy_modules_loaded() -> list[str]:
    return sorted(m for m in HEAVY_MODULES if m in sys.modules)


def log_dir() -> Path:
    """The studio's own log folder (hexstudio.core.logs.log_dir)."""
    return logs.log_dir()


def start_logging() -> Path | None:
    """The GUI's logging: <config>/logs/studio.log (hexstudio/core/logs.py), the exception hooks, Qt's messages."""
    from hexstudio.ui.qt_log import install_qt_message_handler

    path = logs.setup_logging("gui")
    install_qt_message_handler()
    return path


GUI_HELP = """usage: hexstudio [gui] [--workspace FOLDER] [--startup-check]

Open the HexStudio window: the stages of a run on the left, one page per stage, the job dock below.

options:
  --workspace FOLDER  the workspace whose runs the window shows (default: $HEXSTUDIO_WORKSPACE, else
                      settings.json's "workspace", else ~/hexstudio-workspace; the CLI's too)
  --startup-check     open the window, print how long it took and which heavy modules it loaded, and quit
  -h, --help          show this help and exit (needs no display)

The window needs a display (WSLg on Windows 11, X11 or Wayland on Linux) and Qt's xcb libraries on X11
(`./dev qt-libs` installs them). Everything the window does, the CLI does too: `hexstudio --help`."""

# the system libraries Qt's xcb platform plugin loads and PySide6 does not carry (docs/gui.md); a missing one
# made Qt abort with its own "Reinstalling the application may fix this problem"
XCB_LIBS = {
    "xcb-cursor": "libxcb-cursor0",
    "xcb-icccm": "libxcb-icccm4",
    "xcb-keysyms": "libxcb-keysyms1",
    "xcb-image": "libxcb-image0",
    "xcb-render-util": "libxcb-render-util0",
    "xcb-xkb": "libxcb-xkb1",
    "xkbcommon-x11": "libxkbcommon-x11-0",
}


def missing_xcb_packages() -> list[str]:
    """The Debian/Ubuntu packages of XCB_LIBS that the dynamic linker cannot find ([] when all are there)."""
    import ctypes.util

    return [pkg for lib, pkg in XCB_LIBS.items() if ctypes.util.find_library(lib) is None]


def cannot_start(exc: ActionableError) -> int:
    """Why the studio cannot open, in a message box and on stderr; the exit status."""
    from PySide6.QtWidgets import QMessageBox

    print(f"error: {exc.message}" + (f"\n  what to do: {exc.hint}" if exc.hint else ""), file=sys.stderr)
    box = QMessageBox(QMessageBox.Icon.Critical, "HexStudio cannot start", exc.message)
    if exc.hint:
        box.setInformativeText(f"What to do: {exc.hint}")
    box.setObjectName("cannot_start")
    if os.environ.get("QT_QPA_PLATFORM") != "offscreen":  # nobody could close it there
        box.exec()
    return 1


def launch_gui(argv: Sequence[str]) -> int:
    t0 = time.perf_counter()
    args = list(argv)
    if "-h" in args or "--help" in args:
        print(GUI_HELP)
        return 0
    startup_check = "--startup-check" in args
    if startup_check:
        args.remove("--startup-check")
    workspace = None
    if "--workspace" in args:
        i = args.index("--workspace")
        if i + 1 >= len(args):
            print("error: --workspace needs a folder", file=sys.stderr)
            return 2
        workspace = args[i + 1]
        del args[i : i + 2]
    if sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or os.environ.get("QT_QPA_PLATFORM")
    ):
        print(
            "error: no display found (DISPLAY/WAYLAND_DISPLAY are not set).\n"
            "  what to do: on Windows 11 run HexStudio inside WSL2 with WSLg (it sets DISPLAY), or on a "
            "server use the CLI (`hexstudio run --help`), or set QT_QPA_PLATFORM=offscreen for a headless "
            "check.",
            file=sys.stderr,
        )
        return 2
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if sys.platform.startswith("linux") and os.environ.get("DISPLAY") and platform in ("", "xcb"):
        missing = missing_xcb_packages()
        if missing:
            print(
                f"error: Qt's X11 (xcb) plugin needs system libraries that are not installed: {', '.join(missing)}.\n"
                f"  what to do: sudo apt-get install {' '.join(missing)}   (or `./dev qt-libs`), then start "
                "HexStudio again; on Wayland, QT_QPA_PLATFORM=wayland avoids xcb.",
                file=sys.stderr,
            )
            return 2
    import asyncio

    import qasync
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from hexstudio.core.runs import Workspace
    from hexstudio.ui.controller import RunController
    from hexstudio.ui.main_window import MainWindow

    QApplication.setStyle("Fusion")  # follows the system's light or dark palette
    app = QApplication.instance() or QApplication([sys.argv[0], *args])
    app.setApplicationName("HexStudio")
    app.setOrganizationName("HexStudio")
    import logging

    start_logging()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    logs.install_asyncio_handler(loop)
    log = logging.getLogger("hexstudio.gui")
    try:
        controller = RunController(Workspace(workspace) if workspace else None)
    except ActionableError as exc:
        # a damaged settings.json, a workspace that cannot be made: said in a window (started from the Start
        # menu, nobody reads stderr) and on stderr, never a silent traceback
        return cannot_start(exc)
    win = MainWindow(controller)
    reopened = win.restore_last_run()  # the run that was open when the studio last closed
    log.info("studio started (workspace %s, run %s)", controller.workspace.root, reopened or "none")
    controller.finished.connect(
        lambda stage, ok, msg, _hint: log.log(logging.INFO if ok else logging.WARNING, "%s: %s", stage, msg)
    )
    win.show()
    if startup_check:

        def report() -> None:
            print(
                json.dumps(
                    {
                        "first_window_s": round(time.perf_counter() - t0, 3),
                        "heavy_modules": heavy_modules_loaded(),
                        "title": win.windowTitle(),
                    }
                ),
                flush=True,
            )
            app.quit()

        QTimer.singleShot(0, report)
    with loop:
        close = asyncio.Event()
        app.aboutToQuit.connect(close.set)
        loop.run_until_complete(close.wait())
    return 0
