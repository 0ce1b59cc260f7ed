"""The fetcher: claims messages for the handlers (which queues, how many) and hands them to
the executor.

It runs in the main loop's thread (``main_loop.py``), and in the listener's for an idle worker
(:meth:`Fetcher.claim_on_notify`); its lock keeps the two apart. Every claim goes through
:meth:`Fetcher.claim`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError, connections

from ..conf import PgQueueSettings
from ..core import _claim, _execution, _sql, transitions
from ..core._claim_bound import ClaimBounds
from ..core._flow_control import flow_config
from ..core._registry import registry
from ..metrics.instruments import Instruments
from ..models import DeadReason, Message
from . import sql as worker_sql
from .completer import Completer
from .db import is_connection_error, retrying
from .executor import Executor, Job
from .limited import LimitedQueues
from .wakeups import Wakeups

logger = logging.getLogger("django_pgqueue.worker")

#: Seconds of handler work a worker keeps leased beyond what is running (see capacity()).
PREFETCH_SECONDS = 1.0
#: The longest an idle worker sleeps on a far-future message (it polls meanwhile anyway).
LONGEST_DUE_WAIT = 3600.0


class Fetcher:
    def __init__(
        self,
        *,
        worker_id: str,
        alias: str,
        conf: PgQueueSettings,
        visibility_timeout: float | None,
        fixed_queues: list[str],
        excluded: set[str],
        concurrency: int,
        batch_size: int,
        poll_interval: float,
        executor: Executor,
        completer: Completer,
        wakeups: Wakeups,
        instruments: Instruments,
        stop: threading.Event,
        on_db_ok: Callable[[], None],
        claims_on_notify: bool = True,
    ) -> None:
        self.worker_id = worker_id
        self.alias = alias
        self.conf = conf
        self.visibility_timeout = visibility_timeout
        self.fixed_queues = fixed_queues
        self.excluded = excluded
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.executor = executor
        self.completer = completer
        self.wakeups = wakeups
        self.instruments = instruments
        self.stop = stop
        self.on_db_ok = on_db_ok
        # Where the claims start their walk of the claim index; the head watcher looks at its
        # head in their stead.
        self.bounds = ClaimBounds(head_walks_in_claims=False)
        # Held while messages are leased and dispatched: by the main loop, or by the listener
        # thread claiming for an idle worker.
        self.lock = threading.Lock()
        self.claims_on_notify = claims_on_notify
        #: Messages leased since start (--max-messages counts them).
        self.taken = 0
        #: Queues that may have ready messages, tried in turn; and every queue seen.
        self.hot: list[str] = []
        self.known: list[str] = list(fixed_queues)
        # Queues whose last claim a limit or a rate cut short, until they are claimed again.
        self.limited = LimitedQueues(ceiling=poll_interval)
        self._rotation = 0

    # -- how many --------------------------------------------------------------------------

    def capacity(self) -> int:
        """How many leased messages this worker may hold: running plus waiting locally.

        Fast handlers: up to two batches wait, so a lease round trip never starves them.
        Slow handlers: only about ``PREFETCH_SECONDS`` of work waits, so one worker does not
        hoard messages other workers could run now.
        """
        mean = self.executor.mean_run
        waiting = 2 * self.batch_size
        if mean > 0:
            waiting = min(waiting, max(1, int(self.concurrency * PREFETCH_SECONDS / mean)))
        return self.concurrency + waiting

    def free(self) -> int:
        return self.capacity() - self.executor.in_flight()

    def refill_at(self) -> int:
        # Lease full batches when handlers are fast; smaller ones when little may wait.
        return max(1, min(self.batch_size, (self.capacity() - self.concurrency) // 2))

    def on_finished(self) -> None:
        """A handler finished (the executor's callback): wake the main loop when it waits for
        room and there is enough now."""
        if self.executor.in_flight() == 0:
            # Nothing else is running or waiting: no batch to wait for, so the outcomes
            # buffered so far are written now, not after COMPLETION_FLUSH_INTERVAL.
            self.completer.wake()
        if self.wakeups.want_capacity:
            if self.free() >= self.refill_at() or self.executor.in_flight() == 0:
                self.wakeups.wake()

    def on_written(self, queues: set[str]) -> None:
        """Leases ended (the completer's callback): a limited queue waiting for room may
        have some now."""
        freed = self.limited.room_freed(queues)
        if freed:
            self.wakeups.notified(freed)

    # -- which queues ----------------------------------------------------------------------

    def refresh_queues(self) -> None:
        if self.fixed_queues:
            self.hot = list(self.fixed_queues)
            return

        def live() -> list[str]:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(worker_sql.QUEUES_TO_SERVE)
                return [row[0] for row in cursor.fetchall()]

        queues = [
            q
            for q in retrying("listing queues", live, alias=self.alias, abort=self.stop)
            if q not in self.excluded
        ]
        self.on_db_ok()
        self.known = queues
        self.hot = list(queues)

    def heat(self, queues: list[str]) -> None:
        """Try ``queues`` first at the next fetch (they were notified, or room came back)."""
        for queue in queues:
            if queue not in self.hot:
                self.hot.insert(0, queue)
            if queue not in self.known:
                self.known.append(queue)

    def _queues_in_order(self) -> list[str]:
        hot = self.hot
        if len(hot) > 1:
            # Rotate so every queue gets the first pick in turn.
            self._rotation = (self._rotation + 1) % len(hot)
            return hot[self._rotation :] + hot[: self._rotation]
        return list(hot)

    # -- claiming --------------------------------------------------------------------------

    def fetch(self, want: int) -> int:
        """Lease up to ``want`` messages from the hot queues and hand them to the executor."""
        leased: list[Message] = []
        with self.lock:
            try:
                for queue in self._queues_in_order():
                    asked = want - len(leased)
                    if asked <= 0:
                        break
                    batch = retrying(
                        "leasing messages",
                        lambda q=queue, n=asked: self.claim(q, n),  # type: ignore[misc]
                        alias=self.alias,
                        abort=self.stop,
                    )
                    if len(batch) < asked and queue in self.hot:
                        self.hot.remove(queue)
                    self._note_claim(queue, len(batch), asked)
                    leased.extend(batch)
            finally:
                # Even when a stop interrupts the loop: what was leased runs (or is released).
                if leased:
                    self._dispatch(leased)
        return len(leased)

    def claim(self, queue: str, want: int) -> list[Message]:
        """The worker's one claim: up to ``want`` messages of ``queue``, leased."""
        # Claims run on the main loop's and the listener's connections only, and nothing
        # else but the worker's own bookkeeping does: they may keep the claim's settings.
        # Its leases give their attempt back if they expire: the executor runs a redelivered
        # message alone (see "The attempt rule" in core/_sql.py).
        _execution.dedicate_to_claims(connections[self.alias], refund_on_expiry=True)
        batch = _claim.lease(
            queue,
            worker_id=self.worker_id,
            batch_size=want,
            visibility_timeout=self.visibility_timeout,
            using=self.alias,
            decode_payloads=False,  # each handler's thread decodes its own
            bounds=self.bounds,
        )
        self.on_db_ok()
        self.instruments.claimed(queue, len(batch))
        return batch

    def _note_claim(self, queue: str, got: int, asked: int) -> bool:
        """A limited queue's claim cut short is claimed again when room may be back (True)."""
        if got >= asked:
            self.limited.served(queue)
            return False
        flow = flow_config(queue)
        if flow is None or not flow.limited:
            return False
        self.limited.cut_short(queue, got, time.monotonic())
        return True

    def claim_on_notify(self, queue: str) -> bool:
        """In the listener thread: an idle worker claims the notified queue's messages on the
        LISTEN connection and hands them to the handlers itself. True when that settled the
        notification; False leaves it to the main loop (busy worker, nothing ready, more
        ready than one batch, or a claim already under way).

        Why: this is the idle latency. Waking the main loop to claim costs one thread
        hand-off more than claiming here.
        """
        if not self.claims_on_notify or self.executor.in_flight():
            return False
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if self.stop.is_set() or self.executor.in_flight():
                return False
            want = self.batch_size
            batch: list[Message] = []
            try:
                batch = self.claim(queue, want)
            except Exception as exc:
                if isinstance(exc, DatabaseError) and is_connection_error(exc):
                    raise  # the listener reconnects and asks for a catch-up fetch
                # Anything else (a bug) must not cost the worker its listener.
                self._stop_claiming_on_notify(exc)
                return False
            finally:
                if batch:
                    self._dispatch(batch)
            room_soon = self._note_claim(queue, len(batch), want)
            if not batch:
                return False  # perhaps a delayed message: the main loop plans its wake-up
            if len(batch) >= want or room_soon:
                return False  # more may be ready now or soon: the main loop goes on
        finally:
            self.lock.release()
        return True  # drained (scheduled messages come with a wake-up of their own)

    def _stop_claiming_on_notify(self, exc: BaseException) -> None:
        self.claims_on_notify = False
        logger.error(
            "Claiming on the LISTEN connection failed (%s: %s); the main loop claims "
            "everything from now on.",
            type(exc).__name__,
            exc,
            exc_info=exc,
        )

    # -- handing over ----------------------------------------------------------------------

    def vt(self, queue: str) -> float:
        """The visibility timeout of ``queue``'s leases (``--visibility-timeout`` wins)."""
        if self.visibility_timeout is not None:
            return float(self.visibility_timeout)
        return float(self.conf.for_queue(queue, "VISIBILITY_TIMEOUT"))

    def _dispatch(self, leased: list[Message]) -> None:
        jobs: list[Job] = []
        rejected: list[Message] = []
        for_queue = self.conf.for_queue
        for message in leased:
            handler = registry.get(message.task)
            if handler is None:
                rejected.append(message)
                continue
            vt = handler.visibility_timeout or self.vt(message.queue)
            timeout = handler.timeout or for_queue(message.queue, "TASK_TIMEOUT")
            jobs.append(Job(message, handler, vt, timeout))
        self.taken += len(leased)
        if jobs:
            self.executor.submit(jobs)
        for message in rejected:
            self.completer.fail(_rejected(message, self.worker_id), message)

    # -- when next -------------------------------------------------------------------------

    def next_due(self, queues: list[str]) -> float | None:
        """Monotonic time at which the earliest scheduled message of ``queues`` falls due."""
        seconds = retrying(
            "finding the next due message",
            lambda: self.seconds_to_next_due(queues),
            alias=self.alias,
            abort=self.stop,
        )
        return None if seconds is None else due_at(seconds)

    def seconds_to_next_due(self, queues: list[str]) -> float | None:
        """Seconds (database clock) until the earliest scheduled message of ``queues``."""
        earliest: float | None = None
        with connections[self.alias].cursor() as cursor:
            for queue in queues:
                cursor.execute(_sql.NEXT_DUE_AT, {"queue": queue})
                row = cursor.fetchone()
                if row and row[0] is not None:
                    seconds = min(float(row[0]), LONGEST_DUE_WAIT)
                    earliest = seconds if earliest is None else min(earliest, seconds)
        return earliest


def due_at(seconds: float) -> float:
    """Monotonic time ``seconds`` from now, a hair late rather than early: an early wake-up
    finds nothing and sleeps again."""
    return time.monotonic() + max(0.0, seconds) + 0.001


def _rejected(message: Message, worker_id: str) -> transitions.FailedAttempt:
    """The failure that buries a message no handler is registered for, unrun."""
    return transitions.FailedAttempt(
        lease=message,
        error=transitions.error_entry(
            attempt=message.attempts,
            worker_id=worker_id,
            type_name="UnknownTask",
            message=f"no handler is registered for task {message.task!r} in this worker; "
            "nothing was run",
        ),
        retry_in=None,
        final_reason=DeadReason.REJECTED,
    )
