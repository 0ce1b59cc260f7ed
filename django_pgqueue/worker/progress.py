"""Handlers' progress reports (``context.report_progress``) on their way to the database.

Each running message's latest report is kept in memory; the waiting reports are written in one
statement at most every ``PROGRESS_INTERVAL`` (their timer), fenced by lease token, and a
message's row is deleted once its outcome is written (the statements: ``core/_progress.py``).
The completer's thread writes them, before the outcomes of its flush, so a report never lands
after its message finished; the reports are kept under the completer's lock.

Progress is a hint: a write the database refuses costs that report, never an outcome.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from django.db import DatabaseError

from ..core import _progress
from .db import first_line, retrying

if TYPE_CHECKING:
    from ..models import Message

logger = logging.getLogger("django_pgqueue.worker")

#: A report as written: message id, lease token, done, total, note.
Row = tuple[int, uuid.UUID | None, int, int | None, str]


class ProgressReports:
    """The latest report of each running message, written at most every ``interval``."""

    def __init__(self, *, alias: str, interval: float, abort: threading.Event) -> None:
        self.alias = alias
        self.interval = interval
        self.abort = abort  # set -> stop retrying a write during an outage (forced exit)
        self._latest: dict[int, Row] = {}
        self._due = 0.0  # monotonic: when the waiting reports may be written
        self._rows: set[int] = set()  # messages whose row was written (deleted with them)

    # -- in memory (the caller holds the completer's lock) ---------------------------------

    def keep(self, message: Message, done: int, total: int | None, note: str) -> bool:
        """Keep ``message``'s latest report; True when it is the only one waiting (the
        completer then learns of a timer)."""
        first = not self._latest
        self._latest[message.id] = (message.id, message.lease_token, done, total, note)
        return first

    def due_at(self) -> float | None:
        """When the waiting reports are to be written (monotonic), or None: none waits."""
        return self._due if self._latest else None

    def take_due(self, now: float) -> list[Row]:
        """The waiting reports if their time has come (the timer restarts), else none."""
        if not self._latest or now < self._due:
            return []
        reports, self._latest = list(self._latest.values()), {}
        self._due = now + self.interval
        return reports

    def drop_waiting(self) -> None:
        self._latest = {}

    # -- the writes (the completer's thread, without its lock) ------------------------------

    def write(self, reports: list[Row], *, finished: Collection[int]) -> None:
        """Write ``reports`` in one statement, but those of ``finished`` messages (their
        outcome is being written) and of messages without a lease."""
        rows = [r for r in reports if r[1] is not None and r[0] not in finished]
        if not rows:
            return
        self._rows.update(row[0] for row in rows)
        self._send(
            "writing progress",
            lambda: _progress.write_progress(rows, using=self.alias),
            f"Progress of {len(rows)} messages not written",
        )

    def forget(self, finished: list[int]) -> None:
        """Delete the rows of messages whose outcome was just written."""
        gone = [i for i in finished if i in self._rows]
        if not gone:
            return
        self._rows.difference_update(gone)
        # A row left behind by a refused delete goes with retention's housekeeping.
        self._send(
            "deleting progress",
            lambda: _progress.forget_progress(gone, using=self.alias),
            f"Progress of {len(gone)} messages not deleted",
        )

    def _send(self, doing: str, statement: Callable[[], object], refused: str) -> None:
        try:
            retrying(doing, statement, alias=self.alias, abort=self.abort)
        except DatabaseError as exc:
            logger.warning("%s: %s", refused, first_line(exc))
