"""Checks run on every message before any SQL is sent: nothing half-written, nothing lost."""

from __future__ import annotations

import functools
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from ..exceptions import SNOOZE_MAX_SECONDS, InvalidMessage, PayloadError, QueueNameError
from . import _json

__all__ = [
    "MAX_ATTEMPTS_LIMIT",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "QUEUE_NAME_CHECK",
    "QUEUE_NAME_MAX_LENGTH",
    "QUEUE_NAME_PATTERN",
    "RUN_AFTER_EARLIEST",
    "RUN_AFTER_LATEST",
    "QueueNameError",
    "encode_payload",
    "printable",
    "storable_text",
    "validate_delay",
    "validate_duration",
    "validate_priority",
    "validate_queue_name",
]

#: Lower-case letters, digits, ``_`` and ``-``; starts with a letter or digit; 1-48 characters.
#: The same rule is a CHECK constraint on the live table (``models.py``), so raw SQL cannot
#: bypass it; the archive and dead tables take their rows from there.
QUEUE_NAME_MAX_LENGTH = 48
QUEUE_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,47}$"
#: The pattern as the CHECK spells it: the column's ``max_length`` bounds the length, as a
#: bounded repetition costs PostgreSQL's regular-expression engine twice as much per row.
QUEUE_NAME_CHECK = r"^[a-z0-9][a-z0-9_-]*$"
_QUEUE_NAME_RE = re.compile(QUEUE_NAME_PATTERN)
# json.dumps writes U+0000 as the escape \u0000 (after an even run of backslashes, so an
# escaped backslash followed by "u0000" is not mistaken for it).
_NUL_ESCAPE_RE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
TASK_NAME_MAX_LENGTH = 255
# C0 controls (newline, ESC, ...), DEL, C1 controls and the Unicode line and paragraph
# separators: in a task name each could end a log line early or drive a terminal.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
DEDUP_KEY_MAX_LENGTH = 255
#: Longest note a progress report keeps (``MessageContext.report_progress``).
PROGRESS_NOTE_MAX_LENGTH = 200
TENANT_MAX_LENGTH = 255

#: ``run_after`` (a datetime, or database time + a timedelta) falls in [EARLIEST, LATEST).
#: PostgreSQL stores far more, but Python's datetime ends with year 9999: a row it could not
#: read back would break every reader of its queue. The bounds leave room for any time zone.
RUN_AFTER_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
RUN_AFTER_LATEST = datetime(9000, 1, 1, tzinfo=UTC)

#: Most attempts a message may have. A message that keeps failing is kept (live or dead) with
#: a bounded error history (``_sql.ERROR_HISTORY_ENDS``); past this many attempts, retrying
#: again is a loop, not a retry policy.
MAX_ATTEMPTS_LIMIT = 1000

# Django's Tasks framework uses the same range; larger numbers run sooner.
MIN_PRIORITY = -100
MAX_PRIORITY = 100


def validate_queue_name(name: object) -> str:
    if not isinstance(name, str) or len(name) > QUEUE_NAME_MAX_LENGTH or not _is_queue_name(name):
        raise QueueNameError(
            f"Invalid queue name {name!r}: use 1-{QUEUE_NAME_MAX_LENGTH} characters from "
            "a-z, 0-9, '_' and '-', starting with a letter or digit."
        )
    return name


# An application enqueues to a few queues, many times: each name is matched once.
@functools.lru_cache(maxsize=1024)
def _is_queue_name(name: str) -> bool:
    return _QUEUE_NAME_RE.fullmatch(name) is not None


def storable_text(value: str, field: str) -> str:
    """``value``, or :class:`InvalidMessage` naming ``field`` if PostgreSQL cannot store it:
    U+0000 (text refuses it, and libpq would cut the parameter there) or a lone surrogate
    (not UTF-8). The value itself is not repeated in the message: it may be sensitive."""
    if "\x00" in value:
        raise InvalidMessage(
            f"Invalid {field}: it contains U+0000 (NUL) at character {value.index(chr(0))}, "
            "which PostgreSQL cannot store."
        )
    if not value.isascii():  # ASCII text (the common case) is UTF-8: no encoding needed
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidMessage(
                f"Invalid {field}: it contains a lone surrogate (U+{ord(value[exc.start]):04X}) "
                f"at character {exc.start}, which is not UTF-8."
            ) from None
    return value


def validate_task_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > TASK_NAME_MAX_LENGTH:
        raise InvalidMessage(
            f"Invalid task name {name!r}: a non-empty string of at most "
            f"{TASK_NAME_MAX_LENGTH} characters."
        )
    if name.isprintable():  # the common case: no U+0000, lone surrogate nor control
        return name
    storable_text(name, "task")
    control = _CONTROL_RE.search(name)
    if control is not None:
        raise InvalidMessage(
            f"Invalid task name {name!r}: it contains the control character "
            f"U+{ord(control.group()):04X} at character {control.start()}; task names are "
            "logged and shown, so control characters are not allowed."
        )
    return name


def printable(text: str) -> str:
    """``text`` for a log line, with each character that is not printable (newline, ESC,
    ...) written as its Python escape: a task name stored by other means than ``enqueue``
    can neither start a fake log line nor send a terminal a command."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def validate_optional_key(value: object, what: str, max_length: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > max_length:
        raise InvalidMessage(
            f"Invalid {what} {value!r}: None or a non-empty string of at most "
            f"{max_length} characters."
        )
    return storable_text(value, what)


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


def valid_max_attempts(value: object) -> bool:
    return (
        isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_ATTEMPTS_LIMIT
    )


def validate_max_attempts(max_attempts: object) -> int:
    if not valid_max_attempts(max_attempts):
        raise InvalidMessage(
            f"Invalid max_attempts {max_attempts!r}: a whole number between 1 and "
            f"{MAX_ATTEMPTS_LIMIT}."
        )
    assert isinstance(max_attempts, int)
    return max_attempts


def validate_delay(run_after: datetime | timedelta | None) -> tuple[datetime | None, float | None]:
    """Split ``run_after`` into an absolute time or a delay in seconds added to database time.

    Either must fall in [:data:`RUN_AFTER_EARLIEST`, :data:`RUN_AFTER_LATEST`); a delay is
    checked against this host's clock, which the bounds' distance from any real time makes
    as good as the database's.
    """
    if run_after is None:
        return None, None
    if isinstance(run_after, timedelta):
        # In seconds from now: now + run_after itself may overflow.
        delay, now = run_after.total_seconds(), time.time()
        if not _EARLIEST_SECONDS - now <= delay < _LATEST_SECONDS - now:
            raise InvalidMessage(f"run_after {run_after!r} is out of range: {_RUN_AFTER_RANGE}.")
        return None, delay
    if isinstance(run_after, datetime):
        if run_after.tzinfo is None or run_after.utcoffset() is None:
            raise InvalidMessage(
                f"run_after must be an aware datetime (got naive {run_after!r}); "
                "use django.utils.timezone or pass a timedelta."
            )
        if not RUN_AFTER_EARLIEST <= run_after < RUN_AFTER_LATEST:
            raise InvalidMessage(
                f"run_after {run_after.isoformat()} is out of range: {_RUN_AFTER_RANGE}."
            )
        return run_after, None
    raise InvalidMessage(
        f"run_after must be an aware datetime, a timedelta or None; got {type(run_after).__name__}."
    )


#: Longest ``unique_for`` window and ``debounce`` delay, as a ``Snooze``'s: a year. Longer is
#: a schedule, not a window (``run_after``, a periodic job).
DURATION_MAX_SECONDS = SNOOZE_MAX_SECONDS


def validate_duration(value: object, what: str, *, zero: bool = False) -> float:
    """``value`` (a timedelta or a number of seconds) as seconds, in (0, a year]
    (``zero``: from 0); :class:`InvalidMessage` naming ``what`` otherwise."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidMessage(
            f"{what} must be a timedelta or a number of seconds; got {type(value).__name__}."
        )
    low_ok = seconds >= 0 if zero else seconds > 0
    if not (low_ok and seconds <= DURATION_MAX_SECONDS):  # NaN fails too
        low = "from 0" if zero else "more than 0"
        raise InvalidMessage(
            f"{what} must be {low} seconds and at most a year ({DURATION_MAX_SECONDS:.0f}s); "
            f"got {value!r}."
        )
    return seconds


_EARLIEST_SECONDS = RUN_AFTER_EARLIEST.timestamp()
_LATEST_SECONDS = RUN_AFTER_LATEST.timestamp()
_RUN_AFTER_RANGE = (
    f"it must fall from {RUN_AFTER_EARLIEST:%Y-%m-%d} (included) to "
    f"{RUN_AFTER_LATEST:%Y-%m-%d} UTC (excluded), as a datetime or as now + a timedelta"
)


def encode_payload(payload: Any, max_bytes: int) -> str:
    """The payload as JSON text, or :class:`PayloadError`: no ``str()`` fallback, no NaN."""
    try:
        text = _json.dumps(payload)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"Payload is not JSON-serializable: {exc}") from exc
    if text.isascii():  # the common case: one byte a character, no surrogate possible
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise PayloadError(
                f"Payload contains a lone surrogate (U+{ord(text[exc.start]):04X}), which is "
                "not UTF-8 and cannot be stored."
            ) from None
    if size > max_bytes:
        raise PayloadError(
            f"Payload is {size} bytes, over the {max_bytes}-byte cap "
            "(PGQUEUE['MAX_PAYLOAD_BYTES']); store large data elsewhere and pass a reference."
        )
    # json escapes U+0000 as \u0000; the regex (slower) tells it from an escaped backslash.
    if "\\u0000" in text and _NUL_ESCAPE_RE.search(text):
        # PostgreSQL's jsonb cannot store U+0000.
        raise PayloadError("Payload contains a NUL character (\\u0000), which jsonb cannot store.")
    return text
