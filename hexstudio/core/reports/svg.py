"""Small self-contained SVG line charts for reports (no external assets, no JavaScript)."""

from __future__ import annotations

import html
from dataclasses import dataclass

from hexstudio.core.units import nice_ceiling

PALETTE = ("#2f81f7", "#8250df", "#2da44e", "#d1242f", "#bf8700")


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]


def line_chart(
    series: list[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 640,
    height: int = 240,
    hline: tuple[float, str] | None = None,
) -> str:
    pts = [p for s in series for p in s.points]
    if not pts:
        return ""
    left, right, top, bottom = 56, 12, 26, 36
    w, h = width - left - right, height - top - bottom
    xmax = nice_ceiling(max(p[0] for p in pts) or 1.0)
    ymax = nice_ceiling(max([p[1] for p in pts] + ([hline[0]] if hline else [])) * 1.1 or 1.0)

    def sx(x: float) -> float:
        return left + w * x / xmax

    def sy(y: float) -> float:
        return top + h - h * y / ymax

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}" '
        'font-family="sans-serif" font-size="11" fill="currentColor">',
        # text, frame and grid in the page's text colour: readable on a light and on a dark page
        f'<text x="{left}" y="15" font-weight="bold">{html.escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="currentColor" '
        'stroke-opacity="0.45"/>',
    ]
    for i in range(5):
        yv = ymax * i / 4
        xv = xmax * i / 4
        out.append(
            f'<line x1="{left}" x2="{left + w}" y1="{sy(yv):.1f}" y2="{sy(yv):.1f}" stroke="currentColor" stroke-opacity="0.12"/>'
        )
        out.append(f'<text x="{left - 4}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:g}</text>')
        out.append(f'<text x="{sx(xv):.1f}" y="{top + h + 14}" text-anchor="middle">{xv:g}</text>')
    out.append(
        f'<text x="{left + w / 2:.0f}" y="{height - 4}" text-anchor="middle">{html.escape(x_label)}</text>'
    )
    out.append(
        f'<text x="12" y="{top + h / 2:.0f}" transform="rotate(-90 12 {top + h / 2:.0f})" '
        f'text-anchor="middle">{html.escape(y_label)}</text>'
    )
    if hline:
        out.append(
            f'<line x1="{left}" x2="{left + w}" y1="{sy(hline[0]):.1f}" y2="{sy(hline[0]):.1f}" '
            'stroke="#bf8700" stroke-dasharray="5,4"/>'
        )
        out.append(
            f'<text x="{left + w - 4}" y="{sy(hline[0]) - 4:.1f}" text-anchor="end" fill="#bf8700">'
            f"{html.escape(hline[1])}</text>"
        )
    for i, s in enumerate(series):
        if not s.points:
            continue
        color = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s.points)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{path}"/>')
        out.append(
            f'<text x="{left + 8 + 130 * i}" y="{top + 14}" fill="{color}">{html.escape(s.label)}</text>'
        )
    out.append("</svg>")
    return "".join(out)
