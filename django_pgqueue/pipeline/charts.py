"""Small server-side SVG charts for the stats page: no JavaScript, no extra dependency.

Every label goes through :func:`django.utils.html.escape`; the result is safe to inline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

PALETTE = ("#417690", "#ba2121", "#e6a23c", "#70bf2b", "#8e6bbf", "#5b5b5b")
WIDTH = 760
HEIGHT = 220
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 16, 34


@dataclass(frozen=True)
class Series:
    label: str
    values: Sequence[float | None]
    color: str = PALETTE[0]


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** len(str(int(value))) / 10
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def _fmt(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:.1f}k".replace(".0k", "k")
    return f"{value:g}" if value >= 1 or value == 0 else f"{value:.2g}"


def _frame(title: str, x_labels: Sequence[str], top: float, unit: str) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{escape(title)}" class="pgq-chart">',
        f"<title>{escape(title)}</title>",
    ]
    for i in range(5):
        value = top * i / 4
        y = TOP + plot_h - plot_h * i / 4
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#ddd" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" '
            f'fill="#666">{escape(_fmt(value))}{escape(unit)}</text>'
        )
    count = max(len(x_labels), 1)
    every = max(count // 8, 1)
    for i, label in enumerate(x_labels):
        if i % every:
            continue
        x = LEFT + plot_w * (i + 0.5) / count
        parts.append(
            f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle" '
            f'font-size="11" fill="#666">{escape(label)}</text>'
        )
    return parts


def _legend(series: Sequence[Series]) -> str:
    items = []
    x = LEFT
    for s in series:
        items.append(
            f'<rect x="{x}" y="2" width="10" height="10" fill="{s.color}"/>'
            f'<text x="{x + 14}" y="11" font-size="11" fill="#333">{escape(s.label)}</text>'
        )
        x += 24 + 7 * len(s.label)
    return "".join(items)


def stacked_bars(
    title: str, x_labels: Sequence[str], series: Sequence[Series], unit: str = ""
) -> SafeString:
    """One bar per x label, the series stacked in order (e.g. processed + dead per hour)."""
    totals = [sum((s.values[i] or 0) for s in series) for i in range(len(x_labels))] or [0.0]
    top = _nice_max(max(totals))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = _frame(title, x_labels, top, unit)
    slot = plot_w / max(len(x_labels), 1)
    for i, label in enumerate(x_labels):
        base = 0.0
        for s in series:
            value = s.values[i] or 0
            if value <= 0:
                continue
            h = plot_h * value / top
            y = TOP + plot_h - plot_h * base / top - h
            parts.append(
                f'<rect x="{LEFT + slot * i + slot * 0.1:.1f}" y="{y:.1f}" '
                f'width="{max(slot * 0.8, 1):.1f}" height="{h:.1f}" fill="{s.color}">'
                f"<title>{escape(label)}: {escape(s.label)} {escape(_fmt(value))}"
                f"{escape(unit)}</title></rect>"
            )
            base += value
    parts.append(_legend(series))
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every text above is escaped


def lines(
    title: str, x_labels: Sequence[str], series: Sequence[Series], unit: str = ""
) -> SafeString:
    """One polyline per series; gaps where a value is None."""
    values = [v for s in series for v in s.values if v is not None]
    top = _nice_max(max(values, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = _frame(title, x_labels, top, unit)
    count = max(len(x_labels), 1)
    for s in series:
        run: list[str] = []
        for i, value in enumerate([*s.values, None]):
            if value is None:
                if len(run) == 1:
                    cx, cy = run[0].split(",")
                    parts.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{s.color}"/>')
                elif run:
                    parts.append(
                        f'<polyline fill="none" stroke="{s.color}" stroke-width="2" '
                        f'points="{" ".join(run)}"/>'
                    )
                run = []
                continue
            x = LEFT + plot_w * (i + 0.5) / count
            y = TOP + plot_h - plot_h * value / top
            run.append(f"{x:.1f},{y:.1f}")
    parts.append(_legend(series))
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every text above is escaped


def horizontal_bars(
    title: str, items: Sequence[tuple[str, float]], color: str = PALETTE[1]
) -> SafeString:
    """A ranked list as bars (top error signatures, dead letters by reason)."""
    row_h = 22
    height = TOP + row_h * max(len(items), 1) + 8
    label_w = 330
    top = max((v for _, v in items), default=0) or 1
    bar_w = WIDTH - label_w - 70
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-label="{escape(title)}" class="pgq-chart">',
        f"<title>{escape(title)}</title>",
    ]
    for i, (label, value) in enumerate(items):
        y = TOP + row_h * i
        shown = label if len(label) <= 52 else label[:51] + "…"
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 14}" text-anchor="end" font-size="11" '
            f'fill="#333"><title>{escape(label)}</title>{escape(shown)}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{max(bar_w * value / top, 1):.1f}" '
            f'height="{row_h - 8}" fill="{color}"/>'
            f'<text x="{label_w + bar_w * value / top + 6:.1f}" y="{y + 14}" font-size="11" '
            f'fill="#333">{escape(_fmt(value))}</text>'
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every text above is escaped
