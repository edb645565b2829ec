"""Start the studio window on a qasync event loop."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def launch_gui(argv: Sequence[str]) -> int:
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                                                 or os.environ.get("QT_QPA_PLATFORM")):
        print("error: no display found (DISPLAY/WAYLAND_DISPLAY are not set).\n"
              "  what to do: on Windows 11 run HexStudio inside WSL2 with WSLg (it sets DISPLAY), or on a "
              "server use the CLI (`hexstudio run --help`), or set QT_QPA_PLATFORM=offscreen for a headless "
              "check.", file=sys.stderr)
        return 2
    import asyncio

    import qasync
    from PySide6.QtWidgets import QApplication

    from app.ui.main_window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0], *argv])
    app.setApplicationName("HexStudio")
    app.setOrganizationName("HexStudio")
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    win = MainWindow()
    win.show()
    with loop:
        close = asyncio.Event()
        app.aboutToQuit.connect(close.set)
        loop.run_until_complete(close.wait())
    return 0
