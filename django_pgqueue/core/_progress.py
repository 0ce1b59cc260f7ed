"""Progress a handler reports while it runs (``context.report_progress``), and reading it.

One row per message in ``pgqueue_progress``, apart from the live table: a report never
rewrites the message's row nor touches the claim index. The worker keeps each message's
latest report and its completer writes them, at most every ``PROGRESS_INTERVAL`` seconds,
in one statement fenced by lease token; it deletes a message's row with its outcome.
Retention deletes the rows of messages that left the live table otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections

from ..conf import get_settings
from . import _job_control_sql as sql
from ._validation import PROGRESS_NOTE_MAX_LENGTH, storable_text

__all__ = [
    "PROGRESS_NOTE_MAX_LENGTH",
    "Progress",
    "RunningProgress",
    "check_progress",
    "forget_progress",
    "get_progress",
    "running_progress",
    "write_progress",
]

#: Largest ``done`` or ``total`` (PostgreSQL's bigint).
_MAX_COUNT = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Progress:
    """A message's last reported progress: ``done`` of ``total`` (``None``: unknown), a short
    ``note``, and when the worker wrote it (database time)."""

    message_id: int
    done: int
    total: int | None
    note: str
    updated_at: datetime

    @property
    def fraction(self) -> float | None:
        """``done / total`` from 0 to 1, or ``None`` without a total."""
        if not self.total:
            return None
        return max(0.0, min(1.0, self.done / self.total))

    def text(self) -> str:
        """``done/total (pct%) note``, as the admin and ``pgq_status`` show it."""
        counts = f"{self.done:,}" if self.total is None else f"{self.done:,}/{self.total:,}"
        fraction = self.fraction
        percent = "" if fraction is None else f" ({fraction:.0%})"
        return f"{counts}{percent}{f' {self.note}' if self.note else ''}"


@dataclass(frozen=True, slots=True)
class RunningProgress:
    """The progress of a message a worker holds now, for ``pgq_status``."""

    progress: Progress
    queue: str
    task: str
    age_seconds: float


def check_progress(done: object, total: object, note: object) -> tuple[int, int | None, str]:
    """A report's values after their checks: ``TypeError`` or ``ValueError`` naming what is
    wrong, before anything is kept."""
    for what, value in (("done", done), ("total", total)):
        if value is None and what == "total":
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"report_progress(): {what} must be an int; got {value!r}")
        if not 0 <= value <= _MAX_COUNT:
            raise ValueError(f"report_progress(): {what} must be from 0 to 2**63-1; got {value}")
    if not isinstance(note, str):
        raise TypeError(f"report_progress(): note must be a str; got {type(note).__name__}")
    if len(note) > PROGRESS_NOTE_MAX_LENGTH:
        raise ValueError(
            f"report_progress(): note has {len(note)} characters; at most "
            f"{PROGRESS_NOTE_MAX_LENGTH}"
        )
    storable_text(note, "report_progress() note")  # NUL or a lone surrogate: ValueError
    assert isinstance(done, int) and (total is None or isinstance(total, int))
    return done, total, note


def get_progress(message_id: int, *, using: str | None = None) -> Progress | None:
    """The last progress ``message_id``'s handler reported while it runs, or ``None``: it has
    reported none (yet: the worker writes reports at most every ``PROGRESS_INTERVAL``), or
    it is no longer running (it finished, went back to wait, or left the live table)."""
    alias = using or get_settings().DATABASE_ALIAS
    with connections[alias].cursor() as cursor:
        cursor.execute(sql.READ_PROGRESS, [message_id])
        row = cursor.fetchone()
    return None if row is None else Progress(*row)


def running_progress(
    *, queues: Sequence[str] = (), limit: int = 50, using: str | None = None
) -> list[RunningProgress]:
    """The progress of the messages workers hold now (of ``queues``, or all), by id."""
    alias = using or get_settings().DATABASE_ALIAS
    with connections[alias].cursor() as cursor:
        cursor.execute(sql.RUNNING_PROGRESS, {"queues": list(queues), "limit": limit})
        rows = cursor.fetchall()
    return [
        RunningProgress(
            progress=Progress(message_id, done, total, note, updated_at),
            queue=queue,
            task=task,
            age_seconds=age,
        )
        for message_id, queue, task, done, total, note, updated_at, age in rows
    ]


def write_progress(reports: Sequence[tuple[Any, ...]], *, using: str) -> None:
    """Write ``(id, lease token, done, total, note)`` reports, each fenced by its lease."""
    if not reports:
        return
    ids, tokens, done, total, notes = (list(column) for column in zip(*reports, strict=True))
    with connections[using].cursor() as cursor:
        cursor.execute(sql.WRITE_PROGRESS, [ids, tokens, done, total, notes])


def forget_progress(message_ids: Sequence[int], *, using: str) -> None:
    """Delete the progress of messages whose handler has finished."""
    if message_ids:
        with connections[using].cursor() as cursor:
            cursor.execute(sql.FORGET_PROGRESS, [list(message_ids)])
