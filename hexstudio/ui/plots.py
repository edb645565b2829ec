"""Live plots (pyqtgraph): process memory of the running stage, and chat token rate.

Data arrives at any rate; the curves are redrawn by a timer at most 10 times a second, so a
fast stream never floods the event loop.
"""

from __future__ import annotations

from collections import deque

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QSize, Qt, QTimer
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QWidget

from hexstudio.core.units import nice_ceiling

GIB = 1024**3
MAX_POINTS = 20_000


def restyle(plot: pg.PlotWidget) -> None:
    """Background and axes in the widget's palette colours (light or dark, as the system has it)."""
    pal = plot.palette()
    plot.setBackground(pal.color(QPalette.ColorRole.Base))
    fg = pal.color(QPalette.ColorRole.Text)
    for axis in ("left", "bottom"):
        ax = plot.getAxis(axis)
        ax.setPen(fg)
        ax.setTextPen(fg)
    legend = getattr(plot.getPlotItem(), "legend", None)
    if legend is not None:  # over the bars it stays readable: a veil of the page's own colour behind it
        veil = pal.color(QPalette.ColorRole.Base)
        veil.setAlpha(215)
        legend.setBrush(pg.mkBrush(veil))
        legend.setLabelTextColor(fg)  # stored for new labels; a label drawn already is drawn again in it
        for _sample, label in legend.items:
            label.setText(label.text)


def _style(plot: pg.PlotWidget) -> None:
    restyle(plot)
    plot.showGrid(x=True, y=True, alpha=0.2)
    plot.setMenuEnabled(False)
    plot.setMouseEnabled(x=False, y=False)
    plot.hideButtons()
    # a plot is read-only: it takes no keyboard focus, so Tab goes from control to control
    plot.setFocusPolicy(Qt.FocusPolicy.NoFocus)
    for axis in ("left", "bottom"):
        plot.getAxis(axis).enableAutoSIPrefix(False)


class StyledPlot(pg.PlotWidget):
    """A plot that follows the palette: when the system (or the user) switches between light and dark,
    the background and axes are drawn again in the new colours."""

    _styled = False

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        _style(self)
        self._styled = True

    def sizeHint(self) -> QSize:
        # pyqtgraph asks for 600 x 480, which makes a page with two plots taller than most screens
        return QSize(360, 220)

    def changeEvent(self, ev: QEvent) -> None:
        if self._styled and ev.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            restyle(self)
        super().changeEvent(ev)


class SteadyRange:
    """Keeps a plot's range fixed until the data outgrows it (then jumps to the next nice limit)."""

    def __init__(self, plot: pg.PlotWidget, x0: float, y0: float) -> None:
        self.plot = plot
        self.current: tuple[float, float] = (0.0, 0.0)
        plot.disableAutoRange()
        self.fit(x0, y0)

    def fit(self, xmax: float, ymax: float) -> None:
        want = (nice_ceiling(xmax), nice_ceiling(ymax * 1.1))
        if want != self.current:
            self.current = want
            self.plot.setRange(xRange=(0, want[0]), yRange=(0, want[1]), padding=0)


class LivePlot(StyledPlot):
    """A plot fed at any rate: what adds data sets `_dirty`, and a timer redraws it (`draw`) at most ten times
    a second, and only when something changed."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._dirty = False
        self._timer = QTimer(self)
        self._timer.setInterval(100)
        self._timer.timeout.connect(self.redraw)
        self._timer.start()

    def redraw(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        self.draw()

    def draw(self) -> None:
        raise NotImplementedError


class ResourcePlot(LivePlot):
    """RSS and VRAM (GiB) against seconds since the stage started; the preflight estimate as a
    dashed line; the peak marked."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setLabel("left", "GiB")
        self.setLabel("bottom", "s")
        self.addLegend(
            offset=(-6, -6)
        )  # bottom right: memory curves rise and stay up, the peak label is up top
        self.rss_curve = self.plot([], [], pen=pg.mkPen("#2f81f7", width=2), name="RSS")
        self.vram_curve = self.plot([], [], pen=pg.mkPen("#8250df", width=2), name="VRAM")
        self.peak = pg.ScatterPlotItem(size=9, brush=pg.mkBrush("#d1242f"), pen=None)
        self.addItem(self.peak)
        self.peak_label = pg.TextItem(color="#d1242f", anchor=(0, 1))
        self.addItem(self.peak_label)
        self.estimate = pg.InfiniteLine(
            angle=0,
            movable=False,
            pen=pg.mkPen("#bf8700", width=1.5, style=pg.QtCore.Qt.PenStyle.DashLine),
            label="estimate",
            labelOpts={"position": 0.85, "color": "#bf8700"},
        )
        self.estimate.setVisible(False)
        self.addItem(self.estimate)
        self.rss_curve.setClipToView(True)
        self.rss_curve.setDownsampling(auto=True, method="peak")
        self.steady = SteadyRange(self, 60, 0.5)
        self.t: deque[float] = deque(maxlen=MAX_POINTS)
        self.rss: deque[float] = deque(maxlen=MAX_POINTS)
        self.vram: deque[float] = deque(maxlen=MAX_POINTS)
        self.t0: float | None = None
        self.peak_rss = 0.0
        self.peak_t = 0.0

    def clear_data(self) -> None:
        self.t.clear()
        self.rss.clear()
        self.vram.clear()
        self.t0 = None
        self.peak_rss = 0.0
        self._dirty = True

    def set_estimate(self, bytes_: float | None) -> None:
        if bytes_:
            # the label's text is made when the line moves, and only while it is visible: show the line first,
            # then set the format, then the value (the other way round the label kept "estimate" or the
            # previous stage's figure), and draw the text now
            self.estimate.setVisible(True)
            self.estimate.label.setFormat(f"preflight estimate {bytes_ / GIB:.2f} GiB")
            self.estimate.setValue(bytes_ / GIB)
            self.estimate.label.valueChanged()
        else:
            self.estimate.setVisible(False)

    def add(self, t: float, rss_bytes: float, vram_bytes: float | None) -> None:
        if self.t0 is None:
            self.t0 = t
        x = t - self.t0
        self.t.append(x)
        r = rss_bytes / GIB
        self.rss.append(r)
        self.vram.append((vram_bytes or 0) / GIB)
        if r >= self.peak_rss:
            self.peak_rss, self.peak_t = r, x
        self._dirty = True

    def draw(self) -> None:
        t = list(self.t)
        self.rss_curve.setData(t, list(self.rss))
        est = self.estimate.value() if self.estimate.isVisible() else 0.0
        self.steady.fit(
            max(t[-1] if t else 0.0, 60.0),
            max(self.peak_rss, max(self.vram) if self.vram else 0.0, float(est), 0.5),
        )
        if any(self.vram):
            self.vram_curve.setData(t, list(self.vram))
        else:
            self.vram_curve.setData([], [])
        if t:
            self.peak.setData([self.peak_t], [self.peak_rss])
            self.peak_label.setText(f"peak {self.peak_rss:.2f} GiB")
            self.peak_label.setPos(self.peak_t, self.peak_rss)
        else:
            self.peak.setData([], [])
            self.peak_label.setText("")


class TokenRatePlot(LivePlot):
    """Tokens/s over the current reply: a sliding window over token arrivals, drawn as it streams."""

    def __init__(self, parent: QWidget | None = None, window_s: float = 1.0) -> None:
        super().__init__(parent)
        self.setLabel("left", "tokens/s")
        self.setLabel("bottom", "s since the prompt was sent")
        self.window_s = window_s
        self.curve = self.plot([], [], pen=pg.mkPen("#2da44e", width=2))
        self.steady = SteadyRange(self, 5, 10)
        self.arrivals: deque[tuple[float, int]] = deque()
        self.xs: list[float] = []
        self.ys: list[float] = []

    def begin_reply(self) -> None:
        self.arrivals.clear()
        self.xs, self.ys = [], []
        self._dirty = True

    def add_tokens(self, t: float, n: int = 1) -> None:
        """`t` seconds since the prompt was sent; `n` tokens arrived then."""
        self.arrivals.append((t, n))
        while self.arrivals and self.arrivals[0][0] < t - self.window_s:
            self.arrivals.popleft()
        first = self.arrivals[0][0]
        span = max(t - first, 1e-3) if len(self.arrivals) > 1 else self.window_s
        count = sum(k for _, k in self.arrivals) - (self.arrivals[0][1] if len(self.arrivals) > 1 else 0)
        self.xs.append(t)
        self.ys.append(count / span)
        self._dirty = True

    def draw(self) -> None:
        self.curve.setData(self.xs, self.ys)
        self.steady.fit(
            max(self.xs[-1] if self.xs else 0.0, 5.0), max(max(self.ys) if self.ys else 0.0, 10.0)
        )


class ReplyHistoryPlot(StyledPlot):
    """One bar per finished reply: its generation rate (tok/s) as the runner measured it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setLabel("left", "gen tok/s")
        self.setLabel("bottom", "reply")
        self.getAxis("bottom").setTickSpacing(1, 1)  # replies are counted: no 1.5th reply
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.6, brush="#2f81f7")
        self.addItem(self.bars)
        self.disableAutoRange()
        self.setRange(xRange=(0.4, 5.6), yRange=(0, 20), padding=0)
        self.rates: list[float] = []

    def reset(self) -> None:
        self.rates = []
        self.bars.setOpts(x=[], height=[], width=0.6)
        self.setRange(xRange=(0.4, 5.6), yRange=(0, 20), padding=0)

    def add_reply(self, gen_tok_s: float) -> None:
        self.rates.append(gen_tok_s)
        self.bars.setOpts(x=list(range(1, len(self.rates) + 1)), height=self.rates, width=0.6)
        self.setRange(
            xRange=(0.4, max(5, len(self.rates)) + 0.6),
            yRange=(0, nice_ceiling(max(self.rates) * 1.15)),
            padding=0,
        )
