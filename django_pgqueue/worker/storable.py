"""What a worker writes to ``jsonb``: only what PostgreSQL can store, within configured sizes.

``jsonb`` refuses U+0000 and lone UTF-16 surrogates (``\\ud800`` without its pair), and one
refused value fails the whole statement it travels in. So each outcome is checked in its
handler's thread, before it joins a batch: a result is the handler's data and is refused
whole (``ResultNotSerializable``) rather than changed; error messages and tracebacks are
diagnostics, made storable by spelling such characters as visible escapes, and capped.
"""

from __future__ import annotations

import json
import re
import traceback
from typing import Any

from ..conf import get_settings
from ..core._validation import printable
from ..exceptions import ResultNotSerializable

#: What ``jsonb`` refuses in a string: U+0000, and a surrogate that is not half of a pair.
_UNSTORABLE = re.compile(
    "\x00|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]"
)

__all__ = [
    "ResultNotSerializable",
    "describe_exception",
    "encode_result",
    "log_excerpt",
    "storable_text",
    "truncated",
]


def encode_result(result: Any, max_bytes: int | None = None) -> str | None:
    """The result as JSON text ``jsonb`` accepts, or :class:`ResultNotSerializable`.

    ``max_bytes``: the size cap, ``MAX_RESULT_BYTES`` when not given.
    """
    if result is None:
        return None
    if max_bytes is None:
        max_bytes = get_settings().MAX_RESULT_BYTES
    try:
        text = json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ResultNotSerializable(
            f"handler returned a {type(result).__name__} that is not JSON-serializable ({exc}); "
            "return JSON data (dict, list, str, number, bool or None)"
        ) from exc
    # Only these escapes can spell what jsonb refuses: a cheap test first, the exact one after.
    if "\\u0000" in text or "\\ud" in text:
        where = _first_unstorable(result)
        if where is not None:
            raise ResultNotSerializable(
                f"handler returned a result PostgreSQL cannot store as JSON: {where} holds "
                "U+0000 or a lone surrogate"
            )
    if len(text) > max_bytes:  # ASCII: one byte per character
        raise ResultNotSerializable(
            f"handler returned a result of {len(text)} bytes of JSON, more than "
            f"MAX_RESULT_BYTES ({max_bytes})"
        )
    return text


def _first_unstorable(value: Any) -> str | None:
    """Where in ``value`` (a JSON path) the first string ``jsonb`` refuses is, if any."""
    stack: list[tuple[str, Any]] = [("$", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item):
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and _UNSTORABLE.search(key):
                    return f"a key of {path}"
                stack.append((f"{path}[{key!r}]", child))
        elif isinstance(item, list | tuple):
            stack.extend((f"{path}[{i}]", child) for i, child in enumerate(item))
    return None


def storable_text(text: str) -> str:
    """``text`` with U+0000 and lone surrogates spelled as visible escapes (``\\x00``)."""
    if not _UNSTORABLE.search(text):
        return text
    return _UNSTORABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def truncated(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` cut to ``limit`` characters plus a marker saying how many were cut.

    ``keep_end``: keep the first and the last half (a traceback: where it started and the
    exception it ended with); else the beginning.
    """
    cut = len(text) - limit
    if cut <= 0:
        return text
    marker = f"…[truncated {cut} chars]"
    if not keep_end:
        return text[:limit] + marker
    head = limit // 2
    return f"{text[:head]}{marker}{text[len(text) - (limit - head) :]}"


def describe_exception(
    exc: BaseException, *, max_message: int, max_traceback: int
) -> tuple[str, str, str]:
    """``(type, message, traceback)`` of ``exc``, each storable and within its cap.

    A broken ``__str__`` (or traceback formatting) yields a placeholder, never a new error.
    """
    type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        message = str(exc)
    except Exception:
        message = f"<str() of the {type_name} failed>"
    try:
        trace = "".join(traceback.format_exception(exc))
    except Exception:
        trace = f"<the traceback of the {type_name} could not be formatted>"
    return (
        type_name,
        storable_text(truncated(message, max_message)),
        storable_text(truncated(trace, max_traceback, keep_end=True)),
    )


def log_excerpt(text: str | None, limit: int) -> str:
    """At most ``limit`` characters of an error message, on one line, for a log line.

    Logs often travel further than the dead table: the full text stays there.
    """
    if not text or limit <= 0:
        return ""
    flat = printable(" ".join(text.split()))
    return flat if len(flat) <= limit else flat[:limit] + "…"
