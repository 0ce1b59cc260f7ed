"""Checks run on every message before any SQL is sent: nothing half-written, nothing lost."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

from ..exceptions import InvalidMessage, PayloadError, QueueNameError

__all__ = [
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "QUEUE_NAME_CHARACTERS",
    "QUEUE_NAME_MAX_LENGTH",
    "QUEUE_NAME_PATTERN",
    "QueueNameError",
    "encode_payload",
    "validate_delay",
    "validate_priority",
    "validate_queue_name",
]

#: Lower-case letters, digits, ``_`` and ``-``; starts with a letter or digit; 1-48 characters.
#: The same rule is a CHECK constraint on the live table (``models.py``), so raw SQL cannot
#: bypass it; the archive and dead tables take their rows from there.
QUEUE_NAME_MAX_LENGTH = 48
QUEUE_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,47}$"
QUEUE_NAME_CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789_-"
_QUEUE_NAME_RE = re.compile(QUEUE_NAME_PATTERN)
# json.dumps writes U+0000 as the escape \u0000 (after an even run of backslashes, so an
# escaped backslash followed by "u0000" is not mistaken for it).
_NUL_ESCAPE_RE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
TASK_NAME_MAX_LENGTH = 255
DEDUP_KEY_MAX_LENGTH = 255
TENANT_MAX_LENGTH = 255

# Django's Tasks framework uses the same range; larger numbers run sooner.
MIN_PRIORITY = -100
MAX_PRIORITY = 100


def validate_queue_name(name: object) -> str:
    if not isinstance(name, str) or not _QUEUE_NAME_RE.fullmatch(name):
        raise QueueNameError(
            f"Invalid queue name {name!r}: use 1-{QUEUE_NAME_MAX_LENGTH} characters from "
            "a-z, 0-9, '_' and '-', starting with a letter or digit."
        )
    return name


def validate_task_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > TASK_NAME_MAX_LENGTH:
        raise InvalidMessage(
            f"Invalid task name {name!r}: a non-empty string of at most "
            f"{TASK_NAME_MAX_LENGTH} characters."
        )
    return name


def validate_optional_key(value: object, what: str, max_length: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > max_length:
        raise InvalidMessage(
            f"Invalid {what} {value!r}: None or a non-empty string of at most "
            f"{max_length} characters."
        )
    return value


def validate_priority(priority: object) -> int:
    if (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise InvalidMessage(
            f"Invalid priority {priority!r}: a whole number between {MIN_PRIORITY} and "
            f"{MAX_PRIORITY} (larger runs sooner)."
        )
    return priority


def validate_max_attempts(max_attempts: object) -> int:
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
        raise InvalidMessage(f"Invalid max_attempts {max_attempts!r}: a whole number >= 1.")
    return max_attempts


def validate_delay(run_after: datetime | timedelta | None) -> tuple[datetime | None, float | None]:
    """Split ``run_after`` into an absolute time or a delay in seconds added to database time."""
    if run_after is None:
        return None, None
    if isinstance(run_after, timedelta):
        return None, run_after.total_seconds()
    if isinstance(run_after, datetime):
        if run_after.tzinfo is None or run_after.utcoffset() is None:
            raise InvalidMessage(
                f"run_after must be an aware datetime (got naive {run_after!r}); "
                "use django.utils.timezone or pass a timedelta."
            )
        return run_after, None
    raise InvalidMessage(
        f"run_after must be an aware datetime, a timedelta or None; got {type(run_after).__name__}."
    )


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def encode_payload(payload: Any, max_bytes: int) -> str:
    """The payload as JSON text, or :class:`PayloadError`: no ``str()`` fallback, no NaN."""
    try:
        text = _ENCODER.encode(payload)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"Payload is not JSON-serializable: {exc}") from exc
    # A UTF-8 character is at most 4 bytes: short texts need no encoding to be measured.
    if len(text) * 4 > max_bytes and (size := len(text.encode("utf-8"))) > max_bytes:
        raise PayloadError(
            f"Payload is {size} bytes, over the {max_bytes}-byte cap "
            "(PGQUEUE['MAX_PAYLOAD_BYTES']); store large data elsewhere and pass a reference."
        )
    # json escapes U+0000 as \u0000; the regex (slower) tells it from an escaped backslash.
    if "\\u0000" in text and _NUL_ESCAPE_RE.search(text):
        # PostgreSQL's jsonb cannot store U+0000.
        raise PayloadError("Payload contains a NUL character (\\u0000), which jsonb cannot store.")
    return text
