"""What the other threads tell the main loop, and the event that wakes it.

The listener reports notified queues, a next due time and reconnects; the completer reports
queues with retries scheduled and queues whose leases ended; handlers finishing and sync
deadlines wake it. The main loop takes everything reported since its last look in one go
(:meth:`Wakeups.take`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Reported:
    """What was reported since the main loop's previous look."""

    notified: set[str] = field(default_factory=set)
    retried: set[str] = field(default_factory=set)
    due_hint: float | None = None  # monotonic
    catch_up: bool = False


class Wakeups:
    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._reported = Reported()
        #: True while the main loop waits for room to claim more (see Fetcher.on_finished).
        self.want_capacity = False

    def wake(self) -> None:
        self.event.set()

    def notified(self, queues: Iterable[str]) -> None:
        """Messages are ready on ``queues`` (a notification, or room freed on a limited queue)."""
        with self._lock:
            self._reported.notified.update(queues)
        self.event.set()

    def retried(self, queues: Iterable[str]) -> None:
        """Retries were scheduled on ``queues``: a retry sends no notification, so the main
        loop looks up when it falls due instead of waiting for a poll."""
        with self._lock:
            self._reported.retried.update(queues)
        self.event.set()

    def due_at(self, at: float) -> None:
        """A scheduled message falls due at monotonic ``at``."""
        with self._lock:
            hint = self._reported.due_hint
            self._reported.due_hint = at if hint is None else min(hint, at)
        self.event.set()

    def catch_up(self) -> None:
        """Notifications may have been lost (the listener reconnected): look everywhere."""
        with self._lock:
            self._reported.catch_up = True
        self.event.set()

    def take(self) -> Reported:
        with self._lock:
            reported, self._reported = self._reported, Reported()
        return reported

    def wait(self, timeout: float) -> None:
        self.event.wait(timeout)
        self.event.clear()
