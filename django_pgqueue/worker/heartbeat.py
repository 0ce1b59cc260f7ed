"""What a worker tells the world about itself: counters, its heartbeat row, a health file;
and the heartbeat (:class:`Heartbeat`), which keeps the leases it holds and reads the cancel
flags of their messages.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.db import connections

from ..conf import PgQueueSettings
from ..core import transitions
from ..core._log_fields import batch_fields
from ..core._registry import registry
from . import sql
from .db import Stopped, retrying
from .service import Chore

if TYPE_CHECKING:
    from .executor import Executor, Job

logger = logging.getLogger("django_pgqueue.worker")

#: A heartbeat extends leases at least this many times per visibility timeout.
BEATS_PER_LEASE = 3


def beat_interval(conf: PgQueueSettings, queues: list[str], vt: Callable[[str], float]) -> float:
    """``HEARTBEAT_INTERVAL``, but at least ``BEATS_PER_LEASE`` beats per shortest lease of
    ``queues`` (``vt`` gives a queue's) and of the registered handlers."""
    vts = [vt(q) for q in queues]
    vts += [h.visibility_timeout for h in registry.handlers() if h.visibility_timeout]
    return min(conf.HEARTBEAT_INTERVAL, min(vts) / BEATS_PER_LEASE)


@dataclass
class Stats:
    """Counters since start; bumped by the completer thread, read by anyone."""

    processed: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    started: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, *, processed: int = 0, failed: int = 0, retried: int = 0, dead: int = 0) -> None:
        with self._lock:
            self.processed += processed
            self.failed += failed
            self.retried += retried
            self.dead += dead

    def rate_window(self) -> RateWindow:
        """A rate of its own for one reader (the heartbeat, the status line): one reader's
        look never resets another's window."""
        return RateWindow(self)

    def snapshot(self, in_flight: int, rate: float) -> dict[str, Any]:
        return {
            "processed": self.processed,
            "failed": self.failed,
            "retried": self.retried,
            "dead": self.dead,
            "in_flight": in_flight,
            "rate": round(rate, 1),
        }


class RateWindow:
    """Messages archived per second between two looks of one reader."""

    def __init__(self, stats: Stats) -> None:
        self._stats = stats
        self._processed = stats.processed
        self._at = time.monotonic()

    def rate(self) -> float:
        """Messages archived per second since the previous call (or since created)."""
        now = time.monotonic()
        processed = self._stats.processed
        elapsed = now - self._at
        done = processed - self._processed
        self._processed, self._at = processed, now
        return done / elapsed if elapsed > 0 else 0.0


def beat(
    *,
    alias: str,
    worker_id: str,
    hostname: str,
    queues: list[str],
    concurrency: int,
    stats: dict[str, Any],
    first: bool = False,
) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            sql.HEARTBEAT,
            [
                worker_id,
                hostname,
                os.getpid(),
                json.dumps(queues),
                concurrency,
                json.dumps(stats),
                first,
            ],
        )


def forget(*, alias: str, worker_id: str) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql.DELETE_HEARTBEAT, [worker_id])


def touch_health_file(path: Path, worker_id: str, stats: dict[str, Any]) -> None:
    """Rewrite the health file; its mtime is what a liveness probe checks."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"worker_id": worker_id, "at": time.time(), **stats}))
    tmp.replace(path)


class Heartbeat(Chore):
    """Every ``interval`` seconds (in the completer's thread): extend the leases of every
    message the executor holds, pass cancel() flags on to their jobs, upsert the worker's row
    and rewrite the health file. Retries through an outage until ``halt`` is set."""

    def __init__(
        self,
        *,
        interval: float,
        alias: str,
        worker_id: str,
        queues: list[str],
        concurrency: int,
        executor: Executor,
        stats: Stats,
        health_file: Path | None,
        halt: threading.Event,
        on_db_ok: Callable[[], None],
    ) -> None:
        super().__init__(interval)
        self.alias = alias
        self.worker_id = worker_id
        self.hostname = socket.gethostname()
        self.queues = queues
        self.concurrency = concurrency
        self.executor = executor
        self.stats = stats
        self.health_file = health_file
        self.halt = halt
        self.on_db_ok = on_db_ok
        # Its own window: the status line's look must not reset it.
        self._rate = stats.rate_window()

    def run(self) -> None:
        try:
            self._extend_leases()
            retrying("heartbeat", self.write_row, alias=self.alias, abort=self.halt)
        except Stopped:
            pass
        return None

    def _extend_leases(self) -> None:
        by_vt: dict[float, list[Job]] = {}
        for job in self.executor.leases():
            by_vt.setdefault(job.vt, []).append(job)
        for vt, group in by_vt.items():
            messages = [j.message for j in group]
            outcome = retrying(
                "extending leases",
                lambda m=messages, v=vt: transitions.extend(m, v, using=self.alias),  # type: ignore[misc]
                alias=self.alias,
                # Until nothing runs any more: a stop during an outage does not wait for it.
                abort=self.halt,
            )
            if outcome.cancel_requested:
                self.executor.flag_cancelled(outcome.cancel_requested)
            if outcome.stale:
                logger.warning(
                    "Lost the lease of %d in-flight messages (expired and taken by another "
                    "worker, or moved by an operator): %s; their results will not be stored.",
                    len(outcome.stale),
                    outcome.stale[:20],
                    extra=batch_fields(outcome.stale),
                )

    def write_row(self, first: bool = False) -> None:
        """Upsert the worker's row (``first``: this run's first beat) and the health file."""
        snapshot = self.stats.snapshot(self.executor.in_flight(), self._rate.rate())
        beat(
            alias=self.alias,
            worker_id=self.worker_id,
            hostname=self.hostname,
            queues=self.queues,
            concurrency=self.concurrency,
            stats=snapshot,
            first=first,
        )
        self.on_db_ok()
        if self.health_file is not None:
            touch_health_file(self.health_file, self.worker_id, snapshot)

    def read_cancel_flags(self) -> None:
        """Read now which held messages cancel() flagged (a notification said one was; in
        the listener's thread, on its connection): one not started never starts, a running
        handler sees ``cancel_requested``."""
        jobs = self.executor.leases()
        if not jobs:
            return
        with connections[self.alias].cursor() as cursor:
            cursor.execute(sql.CANCEL_FLAGS, [[j.message.id for j in jobs]])
            flagged = [row[0] for row in cursor.fetchall()]
        self.on_db_ok()
        self.executor.flag_cancelled(flagged)
