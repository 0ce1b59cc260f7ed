"""The completer service: archives finished messages and records failures in batches, in a
thread of its own, which also runs the heartbeat (``heartbeat.py``) when it falls due.

Handlers hand their outcome (a result, a failure, a snooze) over and move on; this thread
writes them with one statement per kind and batch (flushed every ``COMPLETION_FLUSH_INTERVAL`` or as soon as ``flush_size`` are
waiting), so processing does not pay a database round trip per message. Writes are fenced by
lease token: a message whose lease was lost is reported stale and left to its new owner.
The progress handlers report is written here too, each message's latest report, at most
every ``PROGRESS_INTERVAL`` (``core/_progress.py``).

Outcomes arrive storable (``storable.py`` checks them in the handler's thread). Should the
database still refuse a batch's data, the batch is written row by row so that only the row
at fault is affected: a result that cannot be stored sends its message to the dead table
with the reason; an error entry that cannot be stored is recorded without its text.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, DataError

from ..conf import get_settings
from ..core import _progress, transitions
from ..core._log_fields import batch_fields, message_fields
from ..core._registry import notify_dead
from ..core._validation import printable
from ..exceptions import ResultNotSerializable, SnoozeLimitExceeded, Stopped
from ..metrics.instruments import Instruments
from ..models import DeadReason
from .db import retrying
from .heartbeat import Heartbeat, Stats
from .service import OnCrash, Service
from .storable import log_excerpt, storable_text

if TYPE_CHECKING:
    from ..models import Message

logger = logging.getLogger("django_pgqueue.worker")


class Completer(Service):
    name = "completer"

    def __init__(
        self,
        *,
        alias: str,
        flush_interval: float,
        flush_size: int,
        stats: Stats,
        abort: threading.Event,
        on_retried: Callable[[set[str]], None] | None = None,
        on_written: Callable[[set[str]], None] | None = None,
        log_error_chars: int = 200,
        instruments: Instruments | None = None,
        on_crash: OnCrash | None = None,
        progress_interval: float | None = None,
    ) -> None:
        super().__init__(on_crash=on_crash)
        self.alias = alias
        self.instruments = instruments or Instruments()
        self.flush_interval = flush_interval
        self.flush_size = flush_size
        self.stats = stats
        self.on_retried = on_retried
        #: Called with the queues of the outcomes each flush wrote: their leases have ended.
        self.on_written = on_written
        self.abort = abort  # set -> stop retrying a write during an outage (forced exit)
        self.log_error_chars = log_error_chars
        self._cond = threading.Condition()
        self._done: list[Message] = []
        self._done_results: list[str | None] = []
        self._failed: list[tuple[transitions.FailedAttempt, Message]] = []
        self._snoozed: list[_Snooze] = []
        # Progress: each message's latest report, written at most every progress_interval;
        # the messages whose row exists (deleted with their outcome).
        self.progress_interval = (
            get_settings().PROGRESS_INTERVAL if progress_interval is None else progress_interval
        )
        self._progress: dict[int, _Report] = {}
        self._progress_due = 0.0
        self._progress_rows: set[int] = set()
        self._oldest = 0.0
        self._busy = False
        self._kicked = False
        #: Run by this thread when due (set by the worker before it starts the thread).
        self.heartbeat: Heartbeat | None = None

    # -- called from handler threads -------------------------------------------------------

    def complete(self, message: Message, result_json: str | None) -> None:
        with self._cond:
            first = not self._waiting()
            if first:
                self._oldest = time.monotonic()
            self._done.append(message)
            self._done_results.append(result_json)
            # Wake the loop to start the flush clock (first) or flush a full batch now.
            if first or len(self._done) >= self.flush_size:
                self._cond.notify()

    def fail(self, attempt: transitions.FailedAttempt, message: Message) -> None:
        with self._cond:
            if not self._waiting():
                self._oldest = time.monotonic()
            self._failed.append((attempt, message))
            self._cond.notify()

    def snooze(self, message: Message, seconds: float, max_snoozes: int) -> None:
        """The handler raised ``Snooze(seconds)``: written with the next batch."""
        with self._cond:
            first = not self._waiting()
            if first:
                self._oldest = time.monotonic()
            self._snoozed.append(_Snooze(message, seconds, max_snoozes))
            if first or self._waiting() >= self.flush_size:
                self._cond.notify()

    def progress(self, message: Message, done: int, total: int | None, note: str) -> None:
        """The handler's latest progress (checked), written when the interval allows."""
        with self._cond:
            first = not self._progress
            self._progress[message.id] = _Report(message, done, total, note)
            if first:
                self._cond.notify()

    def _waiting(self) -> int:
        return len(self._done) + len(self._failed) + len(self._snoozed)

    # -- the thread ------------------------------------------------------------------------

    def run(self) -> None:
        """Flush what is due until stopped, beating meanwhile; then flush what is left."""
        beat = self.heartbeat
        while not self.halt.is_set():
            self.wait_for_work(_FAR if beat is None else max(0.0, beat.next_at - time.monotonic()))
            self.flush()
            if beat is not None:
                self.doing = "completer (heartbeat)"
                beat.run_if_due(time.monotonic())
                self.doing = "completer"
        self.flush()

    def pending(self) -> int:
        with self._cond:
            return self._waiting() + (1 if self._busy else 0)

    def wait_for_work(self, timeout: float) -> None:
        """Block until a batch is due or ``timeout`` passes (called by the completer loop)."""
        with self._cond:
            end = time.monotonic() + timeout
            while True:
                waiting = self._waiting()
                now = time.monotonic()
                if waiting and (
                    waiting >= self.flush_size
                    or self._failed
                    or now - self._oldest >= self.flush_interval
                ):
                    return
                if self._progress and now >= self._progress_due:
                    return
                if now >= end or self._kicked:
                    self._kicked = False
                    return
                limit = end - now
                if waiting:
                    limit = min(limit, self._oldest + self.flush_interval - now)
                if self._progress:
                    limit = min(limit, self._progress_due - now)
                self._cond.wait(max(limit, 0.0005))

    def wake(self) -> None:
        """Make the completer loop flush now (shutdown, burst end)."""
        with self._cond:
            self._kicked = True
            self._cond.notify()

    def take_unwritten(self) -> list[tuple[int, uuid.UUID]]:
        """The leases of every outcome not written, forgotten here: what a worker whose
        completer failed releases before it exits."""
        with self._cond:
            messages = [
                *self._done,
                *(m for _, m in self._failed),
                *(s.message for s in self._snoozed),
            ]
            self._done, self._done_results, self._failed = [], [], []
            self._snoozed, self._progress = [], {}
        return [(m.id, m.lease_token) for m in messages if m.lease_token is not None]

    def flush(self) -> None:
        """Write everything buffered so far (retrying through outages unless aborted), in
        statements of at most ``flush_size`` outcomes: what piled up while a write waited
        (an outage, a slow statement) never goes as one statement whose cost grows with it."""
        with self._cond:
            done, results = self._done, self._done_results
            failed, snoozed = self._failed, self._snoozed
            self._done, self._done_results, self._failed, self._snoozed = [], [], [], []
            progress: dict[int, _Report] = {}
            if self._progress and time.monotonic() >= self._progress_due:
                progress, self._progress = self._progress, {}
                self._progress_due = time.monotonic() + self.progress_interval
            self._busy = bool(done or failed or snoozed or progress)
        size = max(1, self.flush_size)
        finished = (
            [m.id for m in done] + [m.id for _, m in failed] + [s.message.id for s in snoozed]
        )
        queues = {m.queue for m in done} | {m.queue for _, m in failed}
        queues |= {s.message.queue for s in snoozed}
        try:
            if progress:
                ending = set(finished)
                self._write_progress([r for i, r in progress.items() if i not in ending])
            while done:
                self._archive(done[:size], results[:size])
                del done[:size], results[:size]
            while failed:
                self._record_failures(failed[:size])
                del failed[:size]
            while snoozed:
                self._record_snoozes(snoozed[:size])
                del snoozed[:size]
            self._forget_progress(finished)
            if queues and self.on_written is not None:
                self.on_written(queues)
        except Stopped:
            logger.warning(
                "Stopped before %d outcomes could be written; their leases will expire and "
                "the messages run again.",
                len(done) + len(failed),
            )
        except BaseException:
            # A bug: the worker stops (Worker._on_crash) and releases what take_unwritten()
            # returns; a lease whose outcome was written meanwhile is fenced off by then.
            with self._cond:
                self._done[:0], self._done_results[:0] = done, results
                self._failed[:0] = failed
                self._snoozed[:0] = snoozed
            raise
        finally:
            with self._cond:
                self._busy = False

    def _archive(self, done: list[Message], results: list[str | None]) -> None:
        ids = [m.id for m in done]
        refused: list[Message] = []
        try:
            archived = self._write_completions(ids, [m.lease_token for m in done], results)
        except DataError as exc:
            # Not an outage (retrying() rides those out): the data of some row. Find it, so
            # that its batch-mates are archived all the same.
            logger.error(
                "The database refused a batch of %d results (%s); archiving them one by one.",
                len(done),
                _first_line(exc),
            )
            archived = []
            for message, result in zip(done, results, strict=True):
                try:
                    archived += self._write_completions(
                        [message.id], [message.lease_token], [result]
                    )
                except DataError as row_exc:
                    refused.append(message)
                    self._record_failures([(self._refusal(message, row_exc), message)])
        self.stats.add(processed=len(archived))
        if len(archived) == len(done):
            self.instruments.archived([(m.queue, m.task) for m in done])
        else:
            written = set(archived)
            self.instruments.archived([(m.queue, m.task) for m in done if m.id in written])
        if len(archived) + len(refused) != len(ids):
            finished = {*archived, *(m.id for m in refused)}
            stale = [i for i in ids if i not in finished]
            logger.warning(
                "%d completed messages were not archived because their lease was lost "
                "(expired and re-claimed, or moved by an operator): %s",
                len(stale),
                stale[:20],
                extra=batch_fields(stale),
            )

    def _write_completions(
        self,
        ids: list[int],
        tokens: list[uuid.UUID | None],
        results: list[str | None],
    ) -> list[int]:
        def write() -> list[int]:
            outcome = transitions.complete_encoded(ids, tokens, results, using=self.alias)
            return outcome.done

        return retrying("archiving completed messages", write, alias=self.alias, abort=self.abort)

    @staticmethod
    def _refusal(message: Message, exc: BaseException) -> transitions.FailedAttempt:
        """The failure that buries a message whose result the database refused to store."""
        error = transitions.error_entry(
            attempt=message.attempts,
            worker_id=message.leased_by,
            type_name=f"{ResultNotSerializable.__module__}.{ResultNotSerializable.__qualname__}",
            message=storable_text(
                f"the database refused to store the handler's result: {_first_line(exc)}"
            ),
        )
        return transitions.FailedAttempt(
            lease=message, error=error, retry_in=None, final_reason=DeadReason.ERROR
        )

    def _write_failures(self, attempts: list[transitions.FailedAttempt]) -> transitions.Outcome:
        return retrying(
            "recording failed attempts",
            lambda: transitions.fail(attempts, using=self.alias),
            alias=self.alias,
            abort=self.abort,
        )

    def _write_failures_one_by_one(
        self, attempts: list[transitions.FailedAttempt]
    ) -> transitions.Outcome:
        total = transitions.Outcome()
        for attempt in attempts:
            try:
                outcome = self._write_failures([attempt])
            except DataError as exc:
                # The attempt counts all the same; only its refused text is left out.
                error = {
                    **attempt.error,
                    "type": storable_text(str(attempt.error.get("type"))),
                    "message": f"the error text could not be stored: {_first_line(exc)}",
                    "traceback": "",
                }
                outcome = self._write_failures([dataclasses.replace(attempt, error=error)])
            total.done += outcome.done
            total.stale += outcome.stale
            total.retried += outcome.retried
            total.buried += outcome.buried
            total.dead_reasons.update(outcome.dead_reasons)
        return total

    def _record_failures(self, failed: list[tuple[transitions.FailedAttempt, Message]]) -> None:
        attempts = [a for a, _ in failed]
        try:
            outcome = self._write_failures(attempts)
        except DataError as exc:
            logger.error(
                "The database refused a batch of %d failed attempts (%s); recording them one "
                "by one.",
                len(attempts),
                _first_line(exc),
            )
            outcome = self._write_failures_one_by_one(attempts)
        self.stats.add(failed=len(failed), retried=len(outcome.retried), dead=len(outcome.buried))
        # The reason the database buried each with: cancel() overrides the attempt's.
        buried = outcome.dead_reasons
        retried = set(outcome.retried)
        self.instruments.failures(
            failed=[(m.queue, m.task) for _, m in failed],
            retried=[(m.queue, m.task) for _, m in failed if m.id in retried],
            dead=[(m.queue, m.task, buried[m.id]) for _, m in failed if m.id in buried],
        )
        if retried and self.on_retried is not None:
            self.on_retried({m.queue for _, m in failed if m.id in retried})
        for attempt, message in failed:
            error = attempt.error
            if message.id in buried:
                notify_dead(message.task, message.id, buried[message.id])
                logger.warning(
                    "Message %s (%s on %s) dead-lettered: %s after %s of %s attempts: %s%s",
                    message.id,
                    printable(message.task),
                    message.queue,
                    buried[message.id],
                    message.attempts,
                    message.max_attempts,
                    error.get("type"),
                    self._excerpt(error),
                    extra=message_fields(message),
                )
            elif message.id in retried:
                logger.info(
                    "Message %s (%s on %s) failed attempt %s of %s (%s%s); retrying in %.1fs.",
                    message.id,
                    printable(message.task),
                    message.queue,
                    message.attempts,
                    message.max_attempts,
                    error.get("type"),
                    self._excerpt(error),
                    attempt.retry_in or 0.0,
                    extra=message_fields(message),
                )
        if outcome.stale:
            logger.warning(
                "%d failed attempts were not recorded because their lease was lost: %s",
                len(outcome.stale),
                outcome.stale[:20],
                extra=batch_fields(outcome.stale),
            )

    def _record_snoozes(self, snoozed: list[_Snooze]) -> None:
        def write() -> transitions.Outcome:
            return transitions.snooze(
                [s.message for s in snoozed],
                [s.seconds for s in snoozed],
                max_snoozes=[s.max_snoozes for s in snoozed],
                using=self.alias,
            )

        outcome = retrying("recording snoozes", write, alias=self.alias, abort=self.abort)
        done = set(outcome.done)
        for s in snoozed:
            if s.message.id in done:
                logger.info(
                    "Message %s (%s on %s) snoozed for %.1fs; its attempt %s is given back.",
                    s.message.id,
                    printable(s.message.task),
                    s.message.queue,
                    s.seconds,
                    s.message.attempts,
                    extra=message_fields(s.message),
                )
        if done and self.on_retried is not None:
            # A snoozed message waits as a retried one does: the worker plans its wake-up.
            self.on_retried({s.message.queue for s in snoozed if s.message.id in done})
        refused = [
            (self._not_snoozed(s, outcome.not_snoozed[s.message.id]), s.message)
            for s in snoozed
            if s.message.id in outcome.not_snoozed
        ]
        if refused:
            self._record_failures(refused)
        if outcome.stale:
            logger.warning(
                "%d snoozes were not recorded because their lease was lost: %s",
                len(outcome.stale),
                outcome.stale[:20],
                extra=batch_fields(outcome.stale),
            )

    @staticmethod
    def _not_snoozed(snoozed: _Snooze, why: str) -> transitions.FailedAttempt:
        """The failure that buries a message whose snooze was refused."""
        message = snoozed.message
        if why == "cancelled":
            type_name, reason = "Cancelled", DeadReason.CANCELLED
            text = "cancel requested; the handler snoozed, so it is not run again"
        else:
            type_name = f"{SnoozeLimitExceeded.__module__}.{SnoozeLimitExceeded.__qualname__}"
            reason = DeadReason.ERROR
            text = (
                f"the handler snoozed it more than {snoozed.max_snoozes} times "
                "(its max_snoozes, or MAX_SNOOZES)"
            )
        error = transitions.error_entry(
            attempt=message.attempts, worker_id=message.leased_by, type_name=type_name, message=text
        )
        return transitions.FailedAttempt(
            lease=message, error=error, retry_in=None, final_reason=reason
        )

    def _write_progress(self, reports: list[_Report]) -> None:
        rows = [
            (r.message.id, r.message.lease_token, r.done, r.total, r.note)
            for r in reports
            if r.message.lease_token is not None
        ]
        if not rows:
            return
        self._progress_rows.update(row[0] for row in rows)
        try:
            retrying(
                "writing progress",
                lambda: _progress.write_progress(rows, using=self.alias),
                alias=self.alias,
                abort=self.abort,
            )
        except DatabaseError as exc:
            # Progress is a hint: a refused write costs that report, never an outcome.
            logger.warning("Progress of %d messages not written: %s", len(rows), _first_line(exc))

    def _forget_progress(self, finished: list[int]) -> None:
        """Delete the progress rows of messages whose outcome was just written."""
        gone = [i for i in finished if i in self._progress_rows]
        if not gone:
            return
        self._progress_rows.difference_update(gone)
        try:
            retrying(
                "deleting progress",
                lambda: _progress.forget_progress(gone, using=self.alias),
                alias=self.alias,
                abort=self.abort,
            )
        except DatabaseError as exc:  # retention deletes what is left behind
            logger.warning("Progress of %d messages not deleted: %s", len(gone), _first_line(exc))

    def _excerpt(self, error: dict[str, Any]) -> str:
        """``": <excerpt>"`` of an error message for a log line, or nothing (type only)."""
        excerpt = log_excerpt(error.get("message"), self.log_error_chars)
        return f": {excerpt}" if excerpt else ""


@dataclasses.dataclass(frozen=True, slots=True)
class _Snooze:
    message: Message
    seconds: float
    max_snoozes: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Report:
    message: Message
    done: int
    total: int | None
    note: str


#: How long the thread waits for work when no heartbeat is due (a wake-up comes first).
_FAR = 3600.0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
