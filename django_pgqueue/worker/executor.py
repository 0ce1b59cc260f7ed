"""Runs handlers: a pool of threads for sync handlers, one asyncio event loop for async ones.

Each leased message becomes a :class:`Job`. Its state only moves forward under one lock:
``queued -> running -> finished``, or ``queued -> released`` (shutdown gave it back before
it started), or ``running -> abandoned`` (its timeout or the grace period ran out: the
worker already failed or released the lease, so whatever the handler returns later is
dropped). A Python thread cannot be killed, so an abandoned sync handler keeps running until
it returns; its thread then exits and a fresh one has already taken its slot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue as queue_module
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import connections

from ..core import transitions
from ..models import DeadReason
from .context import MessageContext
from .registry import Handler

if TYPE_CHECKING:
    from ..models import Message
    from .completer import Completer

logger = logging.getLogger("django_pgqueue.worker")

QUEUED, RUNNING, FINISHED, RELEASED, ABANDONED = range(5)


class ResultNotSerializable(TypeError):
    """A handler returned something that cannot be stored as JSON."""


class HandlerTimeout(Exception):
    """The handler ran past its per-message timeout."""


class Job:
    """One leased message inside this worker."""

    __slots__ = (
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
        self.started = 0.0
        self.deadline: float | None = None
        # Set by a lease extension that found the message flagged by cancel().
        self.cancel_requested = False
        # Leased with decode_payloads=False: the JSON text is decoded by the handler's
        # thread, off the main loop that claims the next batch.
        self.encoded = isinstance(message.payload, str)

    def payload(self) -> Any:
        """The message's payload, decoded on first use."""
        if self.encoded and isinstance(text := self.message.payload, str):
            self.message.payload = json.loads(text)
            self.encoded = False
        return self.message.payload


def encode_result(result: Any) -> str | None:
    if result is None:
        return None
    try:
        return json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ResultNotSerializable(
            f"handler returned a {type(result).__name__} that is not JSON-serializable ({exc}); "
            "return JSON data (dict, list, str, number, bool or None)"
        ) from exc


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
    ) -> None:
        self.concurrency = concurrency
        self.worker_id = worker_id
        self.alias = alias
        self.completer = completer
        self.on_finished = on_finished
        self.on_deadline = on_deadline
        self.lock = threading.Lock()
        self.jobs: dict[int, Job] = {}  # leased and not yet finished, by message id
        self.mean_run = 0.0  # seconds, moving average over recent handler runs
        self.stuck = 0  # threads still running a handler that timed out
        self._work: queue_module.SimpleQueue[Job | None] = queue_module.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._thread_seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._async_slots: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._helper: ThreadPoolExecutor | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        for _ in range(self.concurrency):
            self._spawn_thread()

    def _spawn_thread(self) -> None:
        self._thread_seq += 1
        thread = threading.Thread(
            target=self._thread_main, name=f"handler-{self._thread_seq}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def stop(self, wait: float) -> None:
        """Let idle threads exit and close their connections (busy ones are daemons)."""
        for _ in self._threads:
            self._work.put(None)
        deadline = time.monotonic() + wait
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(max(0.0, deadline - time.monotonic()))
        if self._helper is not None:
            self._helper.shutdown(wait=False)

    # -- accounting ------------------------------------------------------------------------

    def in_flight(self) -> int:
        return len(self.jobs)

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
                job.state = marking
                del self.jobs[job.message.id]
        return taken

    def expire_overdue(self, now: float) -> float | None:
        """Fail running sync jobs past their deadline; return the next deadline, if any."""
        expired: list[Job] = []
        next_deadline: float | None = None
        with self.lock:
            for job in self.jobs.values():
                if job.state != RUNNING or job.deadline is None or job.handler.is_async:
                    continue
                if job.deadline <= now:
                    job.state = ABANDONED
                    expired.append(job)
                elif next_deadline is None or job.deadline < next_deadline:
                    next_deadline = job.deadline
            self.stuck += len(expired)
            for job in expired:
                # Reported before it leaves ``jobs``: nobody may see it in neither place.
                timeout = HandlerTimeout(f"handler exceeded its timeout of {job.timeout}s")
                self.completer.fail(self._failure(job, timeout), job.message)
                del self.jobs[job.message.id]
        for job in expired:
            logger.warning(
                "Message %s (%s on %s) timed out after %ss on attempt %s of %s; its thread "
                "keeps running until the handler returns, and its result will be dropped.",
                job.message.id,
                job.message.task,
                job.message.queue,
                job.timeout,
                job.message.attempts,
                job.message.max_attempts,
            )
            # The stuck thread still holds a slot: give the pool a fresh one.
            self._spawn_thread()
        return next_deadline

    # -- submission ------------------------------------------------------------------------

    def submit(self, jobs: list[Job]) -> None:
        with self.lock:
            for job in jobs:
                self.jobs[job.message.id] = job
        for job in jobs:
            if job.handler.is_async:
                self._submit_async(job)
            else:
                self._work.put(job)

    def _submit_async(self, job: Job) -> None:
        if self._loop is None:
            self._start_loop()
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._start_task, job)

    def _start_task(self, job: Job) -> None:
        # The loop keeps only weak references to tasks: hold them until they finish.
        assert self._loop is not None
        task = self._loop.create_task(self._run_async(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start_loop(self) -> None:
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._async_slots = asyncio.Semaphore(self.concurrency)
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._loop_thread = threading.Thread(target=main, name="async-handlers", daemon=True)
        self._loop_thread.start()
        ready.wait()

    # -- running ---------------------------------------------------------------------------

    def _start(self, job: Job) -> bool:
        with self.lock:
            if job.state != QUEUED:
                return False
            job.state = RUNNING
            job.started = time.monotonic()
            if job.timeout is None:
                return True
            job.deadline = job.started + job.timeout
        if not job.handler.is_async:
            # The main loop enforces sync deadlines: let it plan a wake-up for this one.
            self.on_deadline()
        return True

    def _finish(self, job: Job, report: Callable[[], None]) -> bool:
        """Report the job's outcome unless it was abandoned meanwhile (then return False).

        The report reaches the completer before the job leaves ``jobs``, so a burst worker
        that sees nothing in flight and nothing buffered is really done.
        """
        with self.lock:
            if job.state != RUNNING:
                return False
            job.state = FINISHED
            report()
            del self.jobs[job.message.id]
            # Moving average of handler run time: sizes how much the worker prefetches.
            self.mean_run += (time.monotonic() - job.started - self.mean_run) * 0.1
        return True

    def _thread_main(self) -> None:
        me = threading.current_thread()
        try:
            while True:
                job = self._work.get()
                if job is None:
                    return
                if not self._start(job):
                    continue
                try:
                    self._run_sync(job)
                except Exception:
                    # A bug here must not kill the thread and strand the job: fail it.
                    logger.exception("Internal error while handling message %s", job.message.id)
                    failure = self._failure(job, RuntimeError("internal worker error"))
                    self._finish(job, partial(self.completer.fail, failure, job.message))
                if job.state == ABANDONED:
                    # Timed out: a replacement thread owns this slot now.
                    with self.lock:
                        self.stuck -= 1
                    return
        finally:
            connections.close_all()
            if me in self._threads:
                self._threads.remove(me)

    def _context(self, job: Job, extend: Callable[[float], bool]) -> MessageContext:
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
            _extend=extend,
            _abandoned=lambda: job.state == ABANDONED,
            _cancel_requested=lambda: job.cancel_requested,
        )

    def _extend_now(self, job: Job, seconds: float) -> bool:
        outcome = transitions.extend([job.message], seconds, using=self.alias)
        if outcome.cancel_requested:
            job.cancel_requested = True
        return bool(outcome.done)

    def _run_sync(self, job: Job) -> None:
        handler = job.handler
        try:
            if handler.takes_context:
                ctx = self._context(job, lambda s: self._extend_now(job, s))
                result = handler.func(ctx, job.payload())
            else:
                result = handler.func(job.payload())
            encoded = encode_result(result)
        except BaseException as exc:  # SystemExit from a handler is a failure too
            # A handler's failed query may leave this thread's connection unusable.
            connections[self.alias].close_if_unusable_or_obsolete()
            failure = self._failure(job, exc)
            if self._finish(job, lambda: self.completer.fail(failure, job.message)):
                self.on_finished()
            return
        if self._finish(job, lambda: self.completer.complete(job.message, encoded)):
            self.on_finished()

    async def _run_async(self, job: Job) -> None:
        assert self._async_slots is not None
        async with self._async_slots:
            if not self._start(job):
                return
            handler = job.handler
            timed_out = False
            try:
                async with asyncio.timeout(job.timeout) as scope:
                    if handler.takes_context:
                        result = await handler.func(
                            self._context(job, self._async_extend(job)), job.payload()
                        )
                    else:
                        result = await handler.func(job.payload())
                encoded = encode_result(result)
            except TimeoutError as exc:
                timed_out = scope.expired()
                error: Exception = (
                    HandlerTimeout(f"handler exceeded its timeout of {job.timeout}s")
                    if timed_out
                    else exc
                )
                failure = self._failure(job, error)
                if self._finish(job, lambda: self.completer.fail(failure, job.message)):
                    self.on_finished()
                return
            except Exception as exc:
                failure = self._failure(job, exc)
                if self._finish(job, lambda: self.completer.fail(failure, job.message)):
                    self.on_finished()
                return
            if self._finish(job, lambda: self.completer.complete(job.message, encoded)):
                self.on_finished()

    def _async_extend(self, job: Job) -> Callable[[float], bool]:
        # Django refuses database calls on a thread running an event loop: run the extension
        # on a helper thread and wait for it (a short, rare call).
        if self._helper is None:
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="lease-extender")
        helper = self._helper

        def extend(seconds: float) -> bool:
            return helper.submit(self._extend_now, job, seconds).result()

        return extend

    # -- failures --------------------------------------------------------------------------

    def _failure(self, job: Job, exc: BaseException) -> transitions.FailedAttempt:
        message = job.message
        timed_out = isinstance(exc, HandlerTimeout)
        handler = job.handler
        delay = transitions.backoff_delay(
            message.attempts, base=handler.backoff_base, maximum=handler.backoff_max
        )
        entry = transitions.error_entry(exc, attempt=message.attempts, worker_id=self.worker_id)
        if timed_out:
            entry["type"] = "Timeout"
        return transitions.FailedAttempt(
            lease=message,
            error=entry,
            retry_in=delay,
            final_reason=DeadReason.TIMEOUT if timed_out else DeadReason.ERROR,
        )
