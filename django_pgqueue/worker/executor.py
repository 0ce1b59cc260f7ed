"""Runs handlers: a pool of threads for sync handlers (``sync_handlers.py``), one asyncio
event loop for async ones (``async_handlers.py``); this module keeps the jobs, their states,
the gate and the deadlines.

Each leased message becomes a :class:`Job`. Its state only moves forward under one lock:
``queued -> running -> finished``, or ``queued -> released`` (shutdown gave it back before
it started), or ``queued -> cancelled`` (``cancel()`` flagged it before it started: it
is buried with reason ``cancelled`` and never runs), or ``running -> abandoned`` (its
timeout or the grace period ran out: the worker already failed or released the lease, so
whatever the handler returns later is dropped). A Python thread cannot be killed, so an
abandoned sync handler keeps running until it returns; its thread then exits and a fresh one
has already taken its slot.

A redelivered message (its previous lease expired: its worker died, perhaps because of this
very message) runs *alone*: it waits until no other handler runs, no other starts until it
ends, and its start is recorded in the database before its handler runs
(``transitions.start_alone``); the others start again once its outcome is written. So when
a handler kills the process, the only lease that spends an attempt is the one running
alone, if any: the batch-mates leased beside it get theirs back (see "The attempt rule" in
``core/_sql.py``). Handlers abandoned after their timeout are not waited for (they may never
return).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from django.db import connections

from ..conf import get_settings
from ..core import _json, transitions
from ..core._log_fields import message_fields
from ..core._registry import Handler
from ..core._validation import printable
from ..exceptions import Snooze
from ..metrics.instruments import Instruments
from .async_handlers import AsyncHandlers
from .context import NO_HEADERS, MessageContext
from .failures import HandlerTimeout, cancelled_before_start, handler_failed
from .storable import encode_result
from .sync_handlers import SyncHandlers

if TYPE_CHECKING:
    from ..models import Message
    from .completer import Completer

logger = logging.getLogger("django_pgqueue.worker")

QUEUED, RUNNING, FINISHED, RELEASED, ABANDONED, CANCELLED = range(6)


class Job:
    """One leased message inside this worker."""

    __slots__ = (
        "alone",
        "cancel_requested",
        "deadline",
        "encoded",
        "handler",
        "message",
        "started",
        "state",
        "timeout",
        "vt",
    )

    def __init__(
        self, message: Message, handler: Handler, vt: float, timeout: float | None
    ) -> None:
        self.message = message
        self.handler = handler
        self.vt = vt
        self.timeout = timeout
        self.state = QUEUED
        self.alone = message.redelivered
        self.started = 0.0
        self.deadline: float | None = None
        # Set by a lease extension that found the message flagged by cancel().
        self.cancel_requested = False
        # Leased with decode_payloads=False: the JSON text is decoded by the handler's
        # thread, off the main loop that claims the next batch.
        self.encoded = isinstance(message.payload, str)

    @property
    def abandoned(self) -> bool:
        return self.state == ABANDONED

    def payload(self) -> Any:
        """The message's payload, decoded on first use."""
        if self.encoded and isinstance(text := self.message.payload, str):
            self.message.payload = _json.loads(text)
            self.encoded = False
        return self.message.payload


class Executor:
    """Runs jobs with at most ``concurrency`` sync handlers and ``concurrency`` async ones."""

    def __init__(
        self,
        *,
        concurrency: int,
        worker_id: str,
        alias: str,
        completer: Completer,
        on_finished: Callable[[], None],
        on_deadline: Callable[[], None] = lambda: None,
        on_crash: Callable[[str, BaseException], None] | None = None,
        instruments: Instruments | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.instruments = instruments or Instruments()
        self.worker_id = worker_id
        self.alias = alias
        self.completer = completer
        self.on_finished = on_finished
        self.on_deadline = on_deadline
        # Told about an error in the executor's own machinery (not a handler's): the worker
        # stops rather than run on with a slot or a job lost.
        self.on_crash = on_crash or _log_crash
        self.conf = get_settings()
        self.lock = threading.Lock()
        self.jobs: dict[int, Job] = {}  # leased and not yet finished, by message id
        self._running = 0  # jobs in RUNNING
        self._alone: Job | None = None  # the job running alone, or waiting to
        self._gate = threading.Condition(self.lock)  # notified when either changes
        self.mean_run = 0.0  # seconds, moving average over recent handler runs
        self.stuck = 0  # threads still running a handler that timed out
        self.sync_handlers = SyncHandlers(self)
        self.async_handlers = AsyncHandlers(self)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.sync_handlers.start(self.concurrency)

    def stop(self, wait: float) -> None:
        """Let idle threads exit and close their connections (busy ones are daemons)."""
        deadline = time.monotonic() + wait
        self.sync_handlers.stop(deadline)
        self.async_handlers.stop(deadline)

    # -- accounting ------------------------------------------------------------------------

    def in_flight(self) -> int:
        return len(self.jobs)

    def dead_threads(self) -> list[str]:
        """Handler threads, and the event loop's, that stopped while they should run."""
        threads = [*self.sync_handlers.threads, self.async_handlers.thread]
        return [t.name for t in threads if t is not None and not t.is_alive()]

    def running(self) -> list[Job]:
        with self.lock:
            return [j for j in self.jobs.values() if j.state == RUNNING]

    def leases(self) -> list[Job]:
        with self.lock:
            return list(self.jobs.values())

    def take_queued(self) -> list[Job]:
        """Mark every job that has not started as released and return them (shutdown)."""
        return self._take_jobs_in(QUEUED, marking=RELEASED)

    def abandon_running(self) -> list[Job]:
        """Mark every running job abandoned and return them (forced shutdown)."""
        return self._take_jobs_in(RUNNING, marking=ABANDONED)

    def _take_jobs_in(self, state: int, *, marking: int) -> list[Job]:
        """Remove every job in ``state``, set each to ``marking`` and return them."""
        with self.lock:
            taken = [j for j in self.jobs.values() if j.state == state]
            for job in taken:
                self._leave(job, marking)
                del self.jobs[job.message.id]
        return taken

    def _leave(self, job: Job, state: int) -> None:
        """Move ``job`` out of QUEUED or RUNNING (the lock held) and wake jobs at the gate.
        A job alone that finished keeps the gate until its outcome is written
        (:meth:`end_alone`)."""
        if job.state == RUNNING:
            self._running -= 1
        if self._alone is job and state != FINISHED:
            self._alone = None
        job.state = state
        self._gate.notify_all()

    def end_alone(self, job: Job) -> None:
        """Open the gate after ``job`` ran alone, once its outcome is written: had another
        handler killed the worker first, the finished message would have spent an attempt."""
        self.completer.wake()
        while self._alone is job and self.completer.pending():
            time.sleep(0.002)
        with self.lock:
            if self._alone is job:
                self._alone = None
                self._gate.notify_all()

    def flag_cancelled(self, message_ids: list[int]) -> None:
        """cancel() flagged these messages: a job not started yet is buried now and never
        starts; a running one's handler sees ``context.cancel_requested``."""
        flagged = set(message_ids)
        buried = False
        with self.lock:
            for job in [j for j in self.jobs.values() if j.message.id in flagged]:
                job.cancel_requested = True
                if job.state == QUEUED:
                    self._bury_cancelled(job)
                    buried = True
        if buried:
            self.on_finished()

    def _bury_cancelled(self, job: Job) -> None:
        """Bury a job cancel() flagged before it started (the lock held). Reported before it
        leaves ``jobs``, as a finished job is (see finish_job)."""
        self.completer.fail(cancelled_before_start(job, worker_id=self.worker_id), job.message)
        self._leave(job, CANCELLED)
        del self.jobs[job.message.id]

    def expire_overdue(self, now: float) -> float | None:
        """Fail running sync jobs past their deadline; return the next deadline, if any."""
        expired: list[Job] = []
        next_deadline: float | None = None
        with self.lock:
            for job in self.jobs.values():
                if job.state != RUNNING or job.deadline is None or job.handler.is_async:
                    continue
                if job.deadline <= now:
                    self._leave(job, ABANDONED)
                    expired.append(job)
                elif next_deadline is None or job.deadline < next_deadline:
                    next_deadline = job.deadline
            self.stuck += len(expired)
            for job in expired:
                # Reported before it leaves ``jobs``: nobody may see it in neither place.
                timeout = HandlerTimeout(f"handler exceeded its timeout of {job.timeout}s")
                self.completer.fail(self.failure_of(job, timeout), job.message)
                del self.jobs[job.message.id]
        for job in expired:
            logger.warning(
                "Message %s (%s on %s) timed out after %ss on attempt %s of %s; its thread "
                "keeps running until the handler returns, and its result will be dropped.",
                job.message.id,
                printable(job.message.task),
                job.message.queue,
                job.timeout,
                job.message.attempts,
                job.message.max_attempts,
                extra=message_fields(job.message),
            )
            # The stuck thread still holds a slot: give the pool a fresh one.
            self.sync_handlers.spawn()
        return next_deadline

    # -- submission ------------------------------------------------------------------------

    def submit(self, jobs: list[Job]) -> None:
        with self.lock:
            for job in jobs:
                self.jobs[job.message.id] = job
        for job in jobs:
            if job.handler.is_async:
                self.async_handlers.submit(job)
            else:
                self.sync_handlers.submit(job)

    # -- running ---------------------------------------------------------------------------

    def start_job(self, job: Job, *, block: bool = True) -> bool | None:
        """Move ``job`` to RUNNING, after the gate (see the module's docstring): True to run
        it, False when it must not run (released, cancelled, or its lease is lost), None when it has to
        wait and ``block`` is False (the event loop's thread must not wait)."""
        with self.lock:
            while job.state == QUEUED:
                if job.alone and self._alone is None:
                    self._alone = job  # no other job starts from now on
                if self._alone is None or (self._alone is job and self._running == 0):
                    break
                if not block:
                    return None
                self._gate.wait()
            if job.state != QUEUED:
                return False
            if job.cancel_requested:
                self._bury_cancelled(job)
            else:
                job.state = RUNNING
                self._running += 1
                job.started = time.monotonic()
                if job.timeout is not None:
                    job.deadline = job.started + job.timeout
        if job.state == CANCELLED:
            self.on_finished()
            return False
        if job.alone and not _record_start_alone(job, self.alias):
            with self.lock:
                if job.state == RUNNING:
                    self._leave(job, RELEASED)
                    del self.jobs[job.message.id]
            self.on_finished()
            return False
        if job.timeout is not None and not job.handler.is_async:
            # The main loop enforces sync deadlines: let it plan a wake-up for this one.
            self.on_deadline()
        return True

    def finish_job(self, job: Job, report: Callable[[], None]) -> bool:
        """Report the job's outcome unless it was abandoned meanwhile (then return False).

        The report reaches the completer before the job leaves ``jobs``, so a burst worker
        that sees nothing in flight and nothing buffered is really done.
        """
        with self.lock:
            if job.state != RUNNING:
                return False
            self._leave(job, FINISHED)
            report()
            del self.jobs[job.message.id]
            # Moving average of handler run time: sizes how much the worker prefetches.
            ran = time.monotonic() - job.started
            self.mean_run += (ran - self.mean_run) * 0.1
        self.instruments.handler_ran(job.message.queue, job.message.task, ran)
        return True

    # -- outcomes: the same for sync and async handlers -----------------------------------

    def handler_returned(self, job: Job, result: Any) -> None:
        """Store what the handler returned; a result that cannot be stored fails the attempt."""
        try:
            encoded = encode_result(result, self.conf.MAX_RESULT_BYTES)
        except BaseException as exc:
            self.handler_raised(job, exc)
            return
        self._finish(job, lambda: self.completer.complete(job.message, encoded))

    def handler_raised(self, job: Job, exc: BaseException) -> None:
        """``Snooze`` postpones the message; anything else (``SystemExit`` too) fails the
        attempt."""
        message = job.message
        if isinstance(exc, Snooze):
            limit = job.handler.max_snoozes
            if limit is None:
                limit = get_settings().for_queue(message.queue, "MAX_SNOOZES")
            seconds = exc.seconds
            self._finish(job, lambda: self.completer.snooze(message, seconds, limit))
            return
        failure = self.failure_of(job, exc)
        self._finish(job, lambda: self.completer.fail(failure, message))

    def _finish(self, job: Job, report: Callable[[], None]) -> None:
        if self.finish_job(job, report):
            self.on_finished()

    def context_for(self, job: Job, extend: Callable[[float], bool]) -> MessageContext:
        m = job.message
        return MessageContext(
            message_id=m.id,
            task=m.task,
            queue=m.queue,
            attempt=m.attempts,
            max_attempts=m.max_attempts,
            worker_id=self.worker_id,
            lease_token=m.lease_token,  # type: ignore[arg-type]
            enqueued_at=m.enqueued_at,
            tenant=m.tenant,
            headers=NO_HEADERS if not m.headers else MappingProxyType(m.headers),
            _extend=extend,
            _abandoned=lambda: job.state == ABANDONED,
            _cancel_requested=lambda: job.cancel_requested,
            # Kept in memory, written by the completer: never blocks, so async handlers too.
            _report_progress=lambda done, total, note: self.completer.progress(
                m, done, total, note
            ),
        )

    def extend_now(self, job: Job, seconds: float) -> bool:
        outcome = transitions.extend([job.message], seconds, using=self.alias)
        if outcome.cancel_requested:
            job.cancel_requested = True
        return bool(outcome.done)

    def failure_of(self, job: Job, exc: BaseException) -> transitions.FailedAttempt:
        return handler_failed(
            job,
            exc,
            worker_id=self.worker_id,
            max_message=self.conf.MAX_ERROR_MESSAGE_CHARS,
            max_traceback=self.conf.MAX_TRACEBACK_CHARS,
        )


def _record_start_alone(job: Job, alias: str) -> bool:
    """Record in the database that ``job``'s handler starts alone; False if it must not
    run: its lease is lost, or the record failed (the lease then expires and the message
    runs again, its attempt given back)."""
    try:
        if transitions.start_alone(job.message, using=alias):
            return True
        logger.warning(
            "Message %s (%s on %s) not run: its lease was lost before it started.",
            job.message.id,
            printable(job.message.task),
            job.message.queue,
            extra=message_fields(job.message),
        )
    except Exception as exc:
        connections[alias].close_if_unusable_or_obsolete()
        logger.warning(
            "Message %s (%s on %s) not run: recording its start failed (%s: %s); it runs "
            "again once its lease expires.",
            job.message.id,
            printable(job.message.task),
            job.message.queue,
            type(exc).__name__,
            exc,
            extra=message_fields(job.message),
        )
    finally:
        if job.handler.is_async:
            # A thread of the event loop's default executor: no connection left behind.
            connections[alias].close()
    return False


def _log_crash(thread: str, exc: BaseException) -> None:
    logger.error("Internal error in the %s thread.", thread, exc_info=exc)
