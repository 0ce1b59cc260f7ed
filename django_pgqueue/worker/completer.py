"""The completer service: writes the outcomes handlers hand over, in batches, in a thread of
its own, which also runs the heartbeat (``heartbeat.py``) when it falls due.

Handlers hand their outcome (a result, a failure, a snooze) over and move on; this thread
writes them with one statement per kind and batch (``outcomes.py``), so processing does not
pay a database round trip per message. Its timer is the flush: every
``COMPLETION_FLUSH_INTERVAL``, or as soon as ``flush_size`` outcomes (or a failure) wait.
The progress handlers report goes out from here too, before the outcomes of the same flush
(``progress.py``, at most every ``PROGRESS_INTERVAL``).

Outcomes arrive storable (``storable.py`` checks them in the handler's thread).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..conf import get_settings
from ..core import transitions
from ..exceptions import Stopped
from ..metrics.instruments import Instruments
from .heartbeat import Heartbeat, Stats
from .outcomes import OutcomeWriter, Snooze
from .progress import ProgressReports
from .service import OnCrash, Service

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
        self.flush_interval = flush_interval
        self.flush_size = flush_size
        self.stats = stats
        #: Called with the queues of the outcomes each flush wrote: their leases have ended.
        self.on_written = on_written
        self.writer = OutcomeWriter(
            alias=alias,
            stats=stats,
            abort=abort,  # set -> stop retrying a write during an outage (forced exit)
            instruments=instruments or Instruments(),
            on_retried=on_retried,
            log_error_chars=log_error_chars,
        )
        self.progress_reports = ProgressReports(
            alias=alias,
            interval=(
                get_settings().PROGRESS_INTERVAL if progress_interval is None else progress_interval
            ),
            abort=abort,
        )
        self._cond = threading.Condition()
        self._done: list[Message] = []
        self._done_results: list[str | None] = []
        self._failed: list[tuple[transitions.FailedAttempt, Message]] = []
        self._snoozed: list[Snooze] = []
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
            self._snoozed.append(Snooze(message, seconds, max_snoozes))
            if first or self._waiting() >= self.flush_size:
                self._cond.notify()

    def progress(self, message: Message, done: int, total: int | None, note: str) -> None:
        """The handler's latest progress (checked), written when the interval allows."""
        with self._cond:
            if self.progress_reports.keep(message, done, total, note):
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
                progress_due = self.progress_reports.due_at()
                if progress_due is not None and now >= progress_due:
                    return
                if now >= end or self._kicked:
                    self._kicked = False
                    return
                limit = end - now
                if waiting:
                    limit = min(limit, self._oldest + self.flush_interval - now)
                if progress_due is not None:
                    limit = min(limit, progress_due - now)
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
            self._snoozed = []
            self.progress_reports.drop_waiting()
        return [(m.id, m.lease_token) for m in messages if m.lease_token is not None]

    def flush(self) -> None:
        """Write everything buffered so far (retrying through outages unless aborted), in
        statements of at most ``flush_size`` outcomes: what piled up while a write waited
        (an outage, a slow statement) never goes as one statement whose cost grows with it."""
        with self._cond:
            done, results = self._done, self._done_results
            failed, snoozed = self._failed, self._snoozed
            self._done, self._done_results, self._failed, self._snoozed = [], [], [], []
            progress = self.progress_reports.take_due(time.monotonic())
            self._busy = bool(done or failed or snoozed or progress)
        size = max(1, self.flush_size)
        finished = (
            [m.id for m in done] + [m.id for _, m in failed] + [s.message.id for s in snoozed]
        )
        queues = {m.queue for m in done} | {m.queue for _, m in failed}
        queues |= {s.message.queue for s in snoozed}
        try:
            if progress:
                self.progress_reports.write(progress, finished=set(finished))
            while done:
                self.writer.archive(done[:size], results[:size])
                del done[:size], results[:size]
            while failed:
                self.writer.record_failures(failed[:size])
                del failed[:size]
            while snoozed:
                self.writer.record_snoozes(snoozed[:size])
                del snoozed[:size]
            self.progress_reports.forget(finished)
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


#: How long the thread waits for work when no heartbeat is due (a wake-up comes first).
_FAR = 3600.0
