"""What a worker counts for its metrics endpoint: outcomes by queue and task, handler run
times, claim batch sizes, listener reconnects.

Plain Python under one lock, so the threads that record (handlers, the completer, the main
loop and the listener) never touch ``prometheus_client``, an optional dependency: the
worker's metrics endpoint turns a :meth:`Instruments.snapshot` into Prometheus samples when
it is scraped (``exposition.py``).

The ``task`` label is a registered task name or :data:`UNREGISTERED_TASK`: whoever enqueues
chooses task names, and a series for each unknown one would grow the scrape for the
worker's life.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field

from ..core._registry import registry

#: Upper bounds (seconds) of the handler run time buckets; ``+Inf`` follows.
DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
#: Upper bounds of the claim batch size buckets (0: a claim that found nothing).
BATCH_BUCKETS: tuple[float, ...] = (0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 10000)
#: The ``task`` label of every message whose task has no handler registered in this worker.
UNREGISTERED_TASK = "(unregistered)"


def task_label(task: str) -> str:
    """``task`` when this worker registered a handler for it, else :data:`UNREGISTERED_TASK`."""
    return task if registry.get(task) is not None else UNREGISTERED_TASK


@dataclass
class Histogram:
    """Counts per bucket (not cumulative; the last one is ``+Inf``), and their sum."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        # ``le`` buckets: a value equal to a bound belongs to that bound's bucket.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.total)


@dataclass(frozen=True)
class Snapshot:
    """A consistent copy of every instrument, for one scrape."""

    processed: dict[tuple[str, str], int]  # (queue, task) -> messages archived
    failed: dict[tuple[str, str], int]  # (queue, task) -> failed attempts recorded
    retried: dict[tuple[str, str], int]  # (queue, task) -> attempts scheduled to run again
    dead: dict[tuple[str, str, str], int]  # (queue, task, reason) -> messages dead-lettered
    durations: dict[tuple[str, str], Histogram]  # (queue, task) -> handler run seconds
    batches: dict[str, Histogram]  # queue -> messages per claim
    listener_reconnects: int


class Instruments:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processed: defaultdict[tuple[str, str], int] = defaultdict(int)
        self._failed: defaultdict[tuple[str, str], int] = defaultdict(int)
        self._retried: defaultdict[tuple[str, str], int] = defaultdict(int)
        self._dead: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        self._durations: dict[tuple[str, str], Histogram] = {}
        self._batches: dict[str, Histogram] = {}
        self._listener_reconnects = 0

    def archived(self, keys: list[tuple[str, str]]) -> None:
        """Messages archived after their handler succeeded, as ``(queue, task)`` each."""
        with self._lock:
            for queue, task in keys:
                self._processed[queue, task_label(task)] += 1

    def failures(
        self,
        failed: list[tuple[str, str]],
        retried: list[tuple[str, str]],
        dead: list[tuple[str, str, str]],
    ) -> None:
        """Failed attempts recorded; those that will run again; those dead-lettered."""
        with self._lock:
            for queue, task in failed:
                self._failed[queue, task_label(task)] += 1
            for queue, task in retried:
                self._retried[queue, task_label(task)] += 1
            for queue, task, reason in dead:
                self._dead[queue, task_label(task), reason] += 1

    def handler_ran(self, queue: str, task: str, seconds: float) -> None:
        key = (queue, task_label(task))
        with self._lock:
            histogram = self._durations.get(key)
            if histogram is None:
                histogram = self._durations[key] = Histogram(DURATION_BUCKETS)
            histogram.observe(seconds)

    def claimed(self, queue: str, size: int) -> None:
        with self._lock:
            histogram = self._batches.get(queue)
            if histogram is None:
                histogram = self._batches[queue] = Histogram(BATCH_BUCKETS)
            histogram.observe(size)

    def listener_reconnected(self) -> None:
        with self._lock:
            self._listener_reconnects += 1

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(
                processed=dict(self._processed),
                failed=dict(self._failed),
                retried=dict(self._retried),
                dead=dict(self._dead),
                durations={k: h.copy() for k, h in self._durations.items()},
                batches={k: h.copy() for k, h in self._batches.items()},
                listener_reconnects=self._listener_reconnects,
            )
