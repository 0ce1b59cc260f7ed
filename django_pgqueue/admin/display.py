"""Payloads, results and tracebacks as escaped, truncated HTML; never trusted as markup."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

__all__ = [
    "activity_items",
    "errors_html",
    "json_html",
    "json_preview",
    "short_duration",
    "text_preview",
    "traceback_html",
    "undecodable_html",
]

# Detail pages show this much of a payload or result; the list shows one short line.
DETAIL_LIMIT = 20_000
PREVIEW_LIMIT = 80
# Each attempt of an error history shows this much of its traceback and of its message.
ATTEMPT_TRACEBACK_LIMIT = 5_000
ATTEMPT_MESSAGE_LIMIT = 2_000


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def _dump(value: Any, *, indent: int | None) -> str:
    separators = None if indent else (",", ":")
    return json.dumps(
        value, indent=indent, sort_keys=True, ensure_ascii=False, separators=separators, default=str
    )


def json_preview(value: Any) -> str:
    """One line for the change list (plain text: the admin escapes it)."""
    return _truncate(_dump(value, indent=None), PREVIEW_LIMIT)


def text_preview(head: str | None, length: int | None) -> str:
    """One line from the first characters of a text the database measured."""
    if head is None:
        return "null"
    hidden = (length or 0) - len(head)
    return f"{head}… ({hidden:,} more characters)" if hidden > 0 else head


def json_html(value: Any, limit: int = DETAIL_LIMIT) -> SafeString:
    """Pretty-printed JSON in a <pre>, escaped by format_html."""
    return format_html('<pre class="pgq-json">{}</pre>', _truncate(_dump(value, indent=2), limit))


def undecodable_html(text: str, limit: int = DETAIL_LIMIT) -> SafeString:
    """Raw JSON text that Python could not decode, escaped and truncated."""
    return format_html(
        '<p class="pgq-note">{}</p><pre class="pgq-json">{}</pre>',
        "Shown as stored: Python cannot decode this JSON (too deep, or a number too long).",
        _truncate(text, limit),
    )


def traceback_html(text: str | None, limit: int = DETAIL_LIMIT) -> SafeString:
    if not text:
        return format_html("<span>{}</span>", "—")
    return format_html('<pre class="pgq-traceback">{}</pre>', _truncate(text, limit))


def errors_html(errors: Any) -> SafeString:
    """Each failed attempt kept: when, where, what, and its traceback; where the history was
    cut, how many attempts are not shown."""
    if not isinstance(errors, list) or not errors:
        return format_html("<span>{}</span>", "no failed attempts")
    items = []
    for entry in errors:
        if not isinstance(entry, dict):
            items.append((json_html(entry, ATTEMPT_TRACEBACK_LIMIT),))
            continue
        if set(entry) == {"omitted"} and isinstance(entry["omitted"], int):
            items.append(
                (
                    format_html(
                        "<em>… {} attempts between these are not shown …</em>",
                        f"{entry['omitted']:,}",
                    ),
                )
            )
            continue
        heading = format_html(
            "<strong>attempt {}</strong> at {} on {}: {}: {}",
            entry.get("attempt", "?"),
            entry.get("at", "?"),
            entry.get("worker") or "?",
            entry.get("type", "?"),
            _truncate(str(entry.get("message", "")), ATTEMPT_MESSAGE_LIMIT),
        )
        traceback = traceback_html(entry.get("traceback"), ATTEMPT_TRACEBACK_LIMIT)
        items.append((format_html("{}{}", heading, traceback),))
    return format_html('<ol class="pgq-errors">{}</ol>', format_html_join("", "<li>{}</li>", items))


# A worker's heartbeat counters in reading order; anything else follows, sorted by name.
ACTIVITY_ORDER = ("processed", "failed", "retried", "dead", "in_flight", "rate")
ACTIVITY_LABELS = {"in_flight": "in flight", "rate": "rate (msg/s)"}


def activity_items(stats: Any) -> list[tuple[str, str]]:
    """``(label, value)`` pairs of a heartbeat's counters, in a fixed order."""
    if not isinstance(stats, dict):
        return []
    known = [key for key in ACTIVITY_ORDER if key in stats]
    others = sorted(key for key in stats if key not in ACTIVITY_ORDER)
    return [
        (ACTIVITY_LABELS.get(key, key.replace("_", " ")), _counter(stats[key]))
        for key in [*known, *others]
    ]


def _counter(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _truncate(str(value), PREVIEW_LIMIT)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


# Above this, an age is shown as such rather than in days (a far-past or infinite timestamp).
LONGEST_AGE = dt.timedelta(days=36_500)


def short_duration(delta: dt.timedelta | None) -> str:
    """``42 s``, ``2 min 5 s``, ``3 h 12 min``, ``2 d 4 h``: an age at a glance."""
    if delta is None:
        return "—"
    if delta >= LONGEST_AGE:
        return "over 100 years"
    seconds = max(int(delta.total_seconds()), 0)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"
