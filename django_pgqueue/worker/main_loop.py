"""The worker's main thread: claims to capacity through the fetcher, enforces sync handlers'
deadlines, runs the chores, and sleeps until the earliest timer or a wake-up.

Its own timers are the poll (``poll_interval`` after the last claim that found messages), the
next due message (``next_due``) and a limited queue's next try (``Fetcher.limited``); the
executor keeps the deadlines, each chore its own timer (``chores.py``).
"""

from __future__ import annotations

import logging
import threading
import time

from .completer import Completer
from .executor import Executor
from .fetcher import Fetcher
from .service import Chore
from .wakeups import Wakeups

logger = logging.getLogger("django_pgqueue.worker")


class MainLoop:
    """Drives the fetcher; shares its parts (executor, completer, wake-ups) and its stop."""

    def __init__(
        self,
        *,
        fetcher: Fetcher,
        chores: list[Chore],
        poll_interval: float,
        burst: bool,
        max_messages: int | None,
        force: threading.Event,
    ) -> None:
        self.fetcher = fetcher
        self.executor: Executor = fetcher.executor
        self.completer: Completer = fetcher.completer
        self.wakeups: Wakeups = fetcher.wakeups
        self.stop: threading.Event = fetcher.stop
        self.chores = chores
        # Due slots of periodic schedules are enqueued first thing in each turn.
        self.schedules: Chore | None = None
        self.poll_interval = poll_interval
        self.burst = burst
        self.max_messages = max_messages
        self.force = force

    def run(self, schedules: Chore | None = None) -> int:
        """Until stopped or done (``--burst``, ``--max-messages``); 1 when more handler threads
        are stuck than the concurrency (only a new process frees them), else 0. The chores'
        timers start now; ``schedules`` runs first thing in each turn."""
        self.schedules = schedules
        for chore in self.chores:
            chore.retime(chore.interval)
        fetcher, executor, wakeups = self.fetcher, self.executor, self.wakeups
        burst, max_messages = self.burst, self.max_messages
        started = time.monotonic()
        refresh = True
        due_check: set[str] = set()
        next_poll = started + self.poll_interval
        next_due: float | None = None
        burst_checked = False
        while not self.stop.is_set():
            now = time.monotonic()
            if self.schedules is not None:
                self.schedules.run_if_due(now)
            next_deadline = executor.expire_overdue(now)
            if executor.stuck > fetcher.concurrency:
                logger.error(
                    "%d handler threads are stuck past their timeout; stopping so that a "
                    "supervisor restarts the worker.",
                    executor.stuck,
                )
                return 1
            reported = wakeups.take()
            if reported.due_hint is not None and (next_due is None or reported.due_hint < next_due):
                next_due = reported.due_hint
            refresh = refresh or reported.catch_up
            if next_due is not None and now >= next_due:
                next_due, refresh = None, True
            if now >= next_poll:
                refresh = True
                next_poll = now + self.poll_interval
            if refresh:
                fetcher.refresh_queues()
                refresh = False
                next_due = None
                due_check.update(fetcher.known)
            due_check.update(reported.retried)
            fetcher.heat([*reported.notified, *fetcher.limited.due(now)])

            in_flight = executor.in_flight()
            free = fetcher.free()
            want = min(fetcher.batch_size, free)
            if max_messages is not None:
                want = min(want, max_messages - fetcher.taken)
                if want <= 0 and in_flight == 0:
                    logger.info("Handled --max-messages=%d; stopping.", max_messages)
                    return 0
            if fetcher.hot and want > 0 and (free >= fetcher.refill_at() or in_flight == 0):
                if fetcher.fetch(want):
                    burst_checked = False
                    next_poll = time.monotonic() + self.poll_interval
                    continue
            if not fetcher.hot and burst and in_flight == 0:
                # Let the completer write retries first: one may be ready again at once.
                self._drain_completer()
                if burst_checked:
                    elapsed = time.monotonic() - started
                    logger.info(
                        "Burst done: nothing ready is left; %d messages in %.2fs (%.0f/s).",
                        fetcher.taken,
                        elapsed,
                        fetcher.taken / elapsed if elapsed > 0 else 0.0,
                    )
                    return 0
                burst_checked, refresh = True, True
                continue
            if not fetcher.hot and due_check and not burst:
                # Only queues that may have changed: a refresh, a NOTIFY, a retry scheduled.
                due = fetcher.next_due(sorted(due_check))
                due_check.clear()
                if due is not None and (next_due is None or due < next_due):
                    next_due = due

            now = time.monotonic()
            for chore in self.chores:
                chore.run_if_due(now)

            timers = [next_poll, *(chore.next_at for chore in self.chores)]
            if self.schedules is not None:
                timers.append(self.schedules.next_at)
            for timer in (next_due, fetcher.limited.next_at(), next_deadline):
                if timer is not None:
                    timers.append(timer)
            self._sleep(max(0.0, min(timers) - time.monotonic()), in_flight)
        return 0

    def _sleep(self, timeout: float, in_flight: int) -> None:
        """Wait for ``timeout`` or a wake-up; a handler finishing wakes the loop when it
        waits for room to claim more."""
        wakeups, fetcher = self.wakeups, self.fetcher
        wakeups.want_capacity = bool(fetcher.hot) or self.burst or self.max_messages is not None
        if wakeups.want_capacity and in_flight and not wakeups.event.is_set():
            # Recheck after publishing the flag: a handler may have finished meanwhile.
            if fetcher.free() >= fetcher.refill_at():
                wakeups.wake()
        wakeups.wait(timeout)
        wakeups.want_capacity = False

    def _drain_completer(self) -> None:
        self.completer.wake()
        while self.completer.pending() and not self.force.is_set():
            time.sleep(0.002)
