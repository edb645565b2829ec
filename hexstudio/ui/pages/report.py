"""Report page: preview the run report and export it as HTML, PDF or JSON.

Export runs `hexstudio report` in a subprocess so PDF rendering never blocks the window."""

from __future__ import annotations

import asyncio
import html
import re
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QCheckBox, QFileDialog, QPushButton, QTextBrowser, QWidget

from hexstudio.core.jobs import cli_command, run_child
from hexstudio.ui.controller import RunController
from hexstudio.ui.pages.base import StagePage
from hexstudio.ui.widgets import STATE_COLORS, button, button_row, note, paper

_SVG = re.compile(r"<svg\b.*?</svg>", re.S | re.I)


def _hosts_in_reports() -> bool:
    """The studio setting include_host_in_reports (an unreadable settings file: False, names left out)."""
    from hexstudio.core.settings import Settings

    try:
        return bool(Settings.load().data.get("include_host_in_reports", False))
    except Exception:
        return False


class ReportPage(StagePage):
    def __init__(self, controller: RunController, parent: QWidget | None = None) -> None:
        super().__init__("report", controller, parent)
        # the exports' own choice; the Run Report stage follows the studio setting include_host_in_reports, and
        # the box starts from it, so the two agree until the person changes the box for an export
        self.redact_hosts = QCheckBox("Exports: leave out host and user names")
        self.redact_hosts.setObjectName("redact_hosts")
        self.redact_hosts.setChecked(not _hosts_in_reports())
        self.redact_hosts.setToolTip(
            "For the Export buttons. The Run Report stage's report.html follows the studio setting "
            "include_host_in_reports (settings.json)."
        )
        self.inputs_layout.addWidget(self.redact_hosts)
        self.export_buttons: dict[str, QPushButton] = {}
        for fmt in ("html", "pdf", "json"):
            b = button(
                f"Export {fmt.upper()}…",
                f"export_{fmt}",
                on_click=lambda _=False, f=fmt: self.export_dialog(f),
            )
            self.export_buttons[fmt] = b
        self.open_button = QPushButton("Open in browser")
        self.open_button.clicked.connect(self.open_in_browser)
        self.folder_button = button(
            "Open folder",
            "open_report_folder",
            "Show the run's report files (HTML, JSON, PDF) in the file manager",
            self.open_folder,
        )
        self.inputs_layout.addLayout(
            button_row(*self.export_buttons.values(), self.open_button, self.folder_button)
        )
        self.export_message = note("")
        self.export_message.setObjectName("export_message")
        self.export_message.setTextFormat(Qt.TextFormat.RichText)
        self.export_message.setOpenExternalLinks(True)
        self.export_message.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.transient_labels.append(self.export_message)
        self.inputs_layout.addWidget(self.export_message)
        self.preview = QTextBrowser()
        self._shown: tuple[str, int, int] | None = (
            None  # the report file the preview holds (path, mtime, size)
        )
        self.preview.setObjectName("report_preview")
        self.preview.setMinimumHeight(420)
        paper(self.preview)  # the report is styled for a white page: readable in a dark palette too
        self.body.insertWidget(self.body.indexOf(self.results_box), self.preview, 1)

    async def export(self, fmt: str, out: Path) -> bool:
        m = self.c.manifest
        if m is None:
            return False
        argv = cli_command("report", str(m.run_dir), "--format", fmt, "--out", str(out))
        if self.redact_hosts.isChecked():
            argv.append("--redact-hosts")
        self.export_message.setText(f"Writing the {fmt.upper()} report…")
        res = await run_child(argv, what=f"The {fmt.upper()} report export")
        if not res.ok:
            self.export_message.setText(
                f"<span style='color:{STATE_COLORS['failed']}'>The report could not be "
                f"written: {html.escape(res.stderr.strip()[-500:])}</span>"
            )
            return False
        self.export_message.setText(
            f"Wrote {html.escape(str(out))} · <a href='{QUrl.fromLocalFile(str(out.parent)).toString()}'>"
            "open its folder</a>"
        )
        # the preview and Open in browser show what was just written
        if fmt == "html" and m is self.c.manifest:
            self.exported_html = (m.run_dir, out)
            self.refresh_results()
            self.export_message.setText(
                f"Wrote {html.escape(str(out))} (shown below) · "
                f"<a href='{QUrl.fromLocalFile(str(out.parent)).toString()}'>open its folder</a>"
            )
        return True

    def export_dialog(self, fmt: str) -> asyncio.Future[bool] | None:
        """Ask where, then write the report in a task. The file dialog runs here, in the slot: inside a coroutine
        its nested event loop would stop every other task (a running stage's among them; hexstudio/ui/modal.py)."""
        m = self.c.manifest
        if m is None:
            return None
        path, _ = QFileDialog.getSaveFileName(
            self, f"Export the {fmt.upper()} report", str(Path.home() / f"{m.run_id}.{fmt}")
        )
        if not path:
            return None
        return asyncio.ensure_future(self.export(fmt, Path(path)))

    def html_path(self) -> Path | None:
        """The report the preview shows: the HTML last exported from this run, until the Report stage writes its
        own again (the export's message says "shown below"), else the stage's."""
        p = self.artifact_path("report.html")
        m = self.c.manifest
        ex = getattr(self, "exported_html", None)
        if m is None or ex is None or ex[0] != m.run_dir or not ex[1].is_file():
            return p
        return Path(ex[1]) if p is None or ex[1].stat().st_mtime >= p.stat().st_mtime else p

    def open_in_browser(self) -> None:
        p = self.html_path()
        if p is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(p)))

    def open_folder(self) -> None:
        d = self.c.stage_dir("report")
        if d is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(d)))

    def refresh_results(self) -> None:
        self.folder_button.setEnabled(self.c.stage_dir("report") is not None)
        p = self.html_path()
        for b in self.export_buttons.values():
            b.setEnabled(self.c.manifest is not None)
        self.open_button.setEnabled(p is not None)
        if p is None:
            self._shown = None
            self.preview.setHtml("<p>Run the Report stage (or export) to see the report here.</p>")
            return
        try:
            st = p.stat()
            shown = (str(p), st.st_mtime_ns, st.st_size)
        except OSError:
            shown = None
        if shown is not None and shown == self._shown:
            return  # every page refreshes at each stage's start and end: a report of a megabyte is laid out once
        self._shown = shown
        text = p.read_text(encoding="utf-8", errors="replace")
        # the preview widget cannot draw SVG plots: say so where they are (the exported file has them)
        self.preview.setHtml(_SVG.sub("<p><i>[plot: open the report in a browser to see it]</i></p>", text))
