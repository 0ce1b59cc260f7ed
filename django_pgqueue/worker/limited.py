"""When the worker claims again from a queue whose claim a limit or a rate cut short.

A queue with a concurrency limit or a rate gives a claim less than its batch when the limit
binds (or when the queue ran out), and no NOTIFY says when room comes back: it comes back
when a lease ends (one of this worker's: its completer says so; another worker's: nobody
does) or as time passes (a rate). So such a queue is claimed again as soon as this worker's
outcomes for it are written, and otherwise after a delay that starts at ``first`` and doubles
while its claims keep coming back empty, up to ``ceiling`` (the poll interval): a queue that
ran out costs a few empty claims, then one per poll.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

#: The first delay after a short claim, seconds.
FIRST_RETRY = 0.05


class LimitedQueues:
    """The limited queues waiting for room, each with the time of its next claim."""

    def __init__(self, ceiling: float, first: float = FIRST_RETRY) -> None:
        self.first = min(first, ceiling)
        self.ceiling = ceiling
        self._lock = threading.Lock()  # the completer thread frees room; the main loop waits
        self._retry_at: dict[str, float] = {}
        self._delay: dict[str, float] = {}

    def __bool__(self) -> bool:
        return bool(self._retry_at)

    def cut_short(self, queue: str, got: int, now: float) -> None:
        """A claim of ``queue`` gave ``got`` messages, fewer than asked for."""
        with self._lock:
            delay = self.first if got else min(2 * self._delay.get(queue, 0.0), self.ceiling)
            delay = max(delay, self.first)
            self._delay[queue] = delay
            self._retry_at[queue] = now + delay

    def served(self, queue: str) -> None:
        """A claim of ``queue`` got its whole batch: the next short one starts over."""
        if queue in self._delay:
            with self._lock:
                self._delay.pop(queue, None)
                self._retry_at.pop(queue, None)

    def room_freed(self, queues: Iterable[str]) -> list[str]:
        """Leases of ``queues`` ended (their outcomes are written): those waiting, to claim now."""
        if not self._retry_at:
            return []
        with self._lock:
            return [q for q in set(queues) if self._retry_at.pop(q, None) is not None]

    def due(self, now: float) -> list[str]:
        """The queues whose delay has passed, to claim now."""
        if not self._retry_at:
            return []
        with self._lock:
            ready = [q for q, at in self._retry_at.items() if at <= now]
            for queue in ready:
                del self._retry_at[queue]
            return ready

    def next_at(self) -> float | None:
        """When the next waiting queue's delay ends (monotonic), if one waits."""
        with self._lock:
            return min(self._retry_at.values(), default=None)
