"""Help → About: versions, documentation, where secrets and logs are kept."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, QUrl, qVersion
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QVBoxLayout, QWidget

from hexstudio.core.logs import log_dir
from hexstudio.ui.controller import RunController
from hexstudio.ui.widgets import STATE_COLORS, open_folder


class AboutDialog(QDialog):
    """Help → About: versions, where the documentation and the logs are."""

    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        import platform

        import pyqtgraph
        import PySide6

        from hexstudio import __version__
        from hexstudio.core.paths import REPO_ROOT
        from hexstudio.core.secrets import backend_info, stored_where

        self.setWindowTitle("About HexStudio")
        self.setObjectName("about_dialog")
        lay = QVBoxLayout(self)
        docs = REPO_ROOT / "docs"
        links = " · ".join(
            f"<a href='{QUrl.fromLocalFile(str(docs / f)).toString()}'>{f}</a>"
            for f in ("gui.md", "genie.md", "board.md", "reports.md", "PERFORMANCE.md")
            if (docs / f).is_file()
        )
        readme = REPO_ROOT / "README.md"
        run = controller.manifest
        kb = backend_info()  # the keyring backend in use, and whether it encrypts (issue 27)
        self.text = QLabel(
            f"<h2>HexStudio {__version__}</h2>"
            "<p>Deploys Hugging Face LLMs to Qualcomm Hexagon NPU boards: quantize (AIMET-ONNX W4A16), validate, "
            "compile (AI Hub → Genie bundle), push over SSH, chat, report.</p>"
            f"<p><b>Versions</b>: Python {platform.python_version()} · Qt {qVersion()} · PySide6 "
            f"{PySide6.__version__} · pyqtgraph {pyqtgraph.__version__} · {html.escape(platform.platform())}</p>"
            f"<p><b>Documentation</b>: <a href='{QUrl.fromLocalFile(str(readme)).toString()}'>README</a> · {links}</p>"
            + (
                f"<p style='color:{STATE_COLORS['failed']}'><b>Warning</b>: secrets (passwords, tokens) are kept "
                if kb.get("warning")
                else "<p><b>Secrets</b> (passwords, tokens) are kept "
            )
            + f"{html.escape(stored_where(kb))}.</p>"
            f"<p><b>Studio log</b>: {html.escape(str(log_dir()))}<br>"
            f"<b>Workspace</b>: {html.escape(str(controller.workspace.root))}"
            + (f"<br><b>This run's logs</b>: {html.escape(str(run.run_dir / 'logs'))}" if run else "")
            + "</p>"
        )
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setWordWrap(True)
        self.text.setOpenExternalLinks(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        lay.addWidget(self.text)
        bb = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        logs = bb.addButton("Open the log folder", QDialogButtonBox.ButtonRole.ActionRole)
        logs.clicked.connect(lambda: open_folder(log_dir()))
        if run is not None:
            rl = bb.addButton("Open this run's folder", QDialogButtonBox.ButtonRole.ActionRole)
            rl.clicked.connect(lambda: open_folder(run.run_dir))
        bb.rejected.connect(self.reject)
        lay.addWidget(bb)
        self.resize(640, 360)
