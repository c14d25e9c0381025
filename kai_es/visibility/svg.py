"""Line charts as inline SVG strings, drawn server-side. Pure.

Contract: `line_chart(series, ...)` draws each series (label, CSS class, points (x, y) with
integer x and y) on shared axes scaled to all points; coordinates are computed in integers
(SVG user units); labels are HTML-escaped; a chart with no points says so instead of drawing.
A series longer than the chart is wide keeps, per horizontal pixel, its first point and the
points where it reaches its minimum and maximum there (so a spike is never lost), which bounds
the SVG's size by the chart's width, not by the series' length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

Series = tuple[str, str, Sequence[tuple[int, int]]]


def line_chart(series: Sequence[Series], *, width: int = 720, height: int = 200, title: str = "",
               y_label: Callable[[int], str] = str, x_label: Callable[[int], str] = str) -> str:
    """An <svg> element (see module docstring). `y_label`/`x_label` format the axis ends."""
    points = [pt for _, _, pts in series for pt in pts]
    head = (f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
            f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>')
    if not points:
        return head + f'<text x="{width // 2}" y="{height // 2}" text-anchor="middle">no cycle yet</text></svg>'
    left, right, top, bottom = 64, 8, 8, 24
    x0, x1 = min(x for x, _ in points), max(x for x, _ in points)
    y1 = max(max(y for _, y in points), 1)
    pw, ph = width - left - right, height - top - bottom

    def sx(x: int) -> int:
        return left + ((x - x0) * pw // (x1 - x0) if x1 > x0 else pw)

    def sy(y: int) -> int:
        return top + ph - max(0, y) * ph // y1

    parts = [head,
             f'<line class="axis" x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}"/>',
             f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}"/>',
             f'<text class="tick" x="{left - 4}" y="{top + 10}" text-anchor="end">{escape(y_label(y1))}</text>',
             f'<text class="tick" x="{left - 4}" y="{top + ph}" text-anchor="end">{escape(y_label(0))}</text>',
             f'<text class="tick" x="{left}" y="{height - 6}">{escape(x_label(x0))}</text>',
             f'<text class="tick" x="{left + pw}" y="{height - 6}" text-anchor="end">{escape(x_label(x1))}</text>']
    legend_x = left + 8
    for label, css, pts in series:
        coords = " ".join(f"{px},{py}" for px, py in _thin([(sx(x), sy(y)) for x, y in pts]))
        parts.append(f'<polyline class="{escape(css)}" fill="none" points="{coords}"/>')
        parts.append(f'<text class="legend {escape(css)}" x="{legend_x}" y="{top + 12}">{escape(label)}</text>')
        legend_x += 12 + 7 * len(label)
    parts.append("</svg>")
    return "".join(parts)


def _thin(pixels: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Per pixel column: the first point, the extremes, and the last (in order)."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(pixels):
        j = i
        while j < len(pixels) and pixels[j][0] == pixels[i][0]:
            j += 1
        column = pixels[i:j]
        keep = {0, len(column) - 1,
                min(range(len(column)), key=lambda k: column[k][1]),
                max(range(len(column)), key=lambda k: column[k][1])}
        out.extend(column[k] for k in sorted(keep))
        i = j
    return out
