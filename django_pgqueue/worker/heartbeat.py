"""What a worker tells the world about itself: counters, its heartbeat row, a health file."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connections

from . import sql


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
