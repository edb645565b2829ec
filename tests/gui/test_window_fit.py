"""Issue 32: at 150 % on a 1280x720 screen the restored window's title bar was not counted and lay 20 px above
the screen. The window is fitted frame and all (title bar, borders) into the screen's available area, also
before the window manager has decorated it (a title bar's height is kept for it)."""

from __future__ import annotations

from PySide6.QtCore import QRect

from hexstudio.ui.main_window import fitted_frame

AVAIL_150 = QRect(0, 0, 853, 480)  # 1280x720 at 150 %, in device-independent pixels


def test_a_decorated_window_keeps_its_title_bar_on_the_screen() -> None:
    client = QRect(0, 0, 853, 480)  # restored at the screen's full size: the title bar above it
    frame = QRect(-1, -20, 855, 501)  # the window manager's frame: 20 px title, 1 px borders
    x, y, w, h = fitted_frame(AVAIL_150, client, frame)
    assert (w, h) == (853 - 2, 480 - 21)
    assert x >= 0 and y >= 0
    assert x + w + 2 <= 853 and y + h + 21 <= 480  # the whole frame inside the available area


def test_before_decoration_room_is_kept_for_the_title_bar() -> None:
    client = QRect(0, 0, 1880, 1150)  # saved on a big screen, restored before the frame is known
    x, y, w, h = fitted_frame(AVAIL_150, client, QRect(client), title_guess=24)
    assert (x, y) == (0, 0) and w == 853 and h == 480 - 24


def test_a_window_below_the_taskbar_is_moved_up_frame_included() -> None:
    avail = QRect(0, 0, 853, 440)  # a 40-px taskbar at the bottom
    client = QRect(100, 300, 700, 480)
    frame = QRect(99, 280, 702, 501)
    x, y, _w, h = fitted_frame(avail, client, frame)
    assert h == 440 - 21 and y == 0 and x == 99
    assert y + h + 21 <= 440


def test_a_window_that_fits_is_left_alone() -> None:
    client = QRect(50, 60, 700, 400)
    frame = QRect(49, 40, 702, 421)
    assert fitted_frame(AVAIL_150, client, frame, title_guess=24) == (49, 40, 700, 400)
