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

# Upsert of the worker's row; ``last_seen_at`` is database time, like every other clock here.
UPSERT_HEARTBEAT = """
INSERT INTO pgqueue_worker
    (worker_id, hostname, pid, queues, concurrency, started_at, last_seen_at, stats)
VALUES (%s, %s, %s, %s::jsonb, %s, now(), now(), %s::jsonb)
ON CONFLICT (worker_id) DO UPDATE
SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
    concurrency = EXCLUDED.concurrency, last_seen_at = now(), stats = EXCLUDED.stats
"""

# The first beat of a run: a worker restarted under the same id starts its clock again.
REGISTER_WORKER = UPSERT_HEARTBEAT.replace(
    "last_seen_at = now()", "started_at = now(), last_seen_at = now()"
)

DELETE_HEARTBEAT = "DELETE FROM pgqueue_worker WHERE worker_id = %s"


@dataclass
class Stats:
    """Counters since start; bumped by the completer thread, read by anyone."""

    processed: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    started: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _last_processed: int = 0
    _last_at: float = field(default_factory=time.monotonic)

    def add(self, *, processed: int = 0, failed: int = 0, retried: int = 0, dead: int = 0) -> None:
        with self._lock:
            self.processed += processed
            self.failed += failed
            self.retried += retried
            self.dead += dead

    def rate(self) -> float:
        """Messages archived per second since the previous call."""
        now = time.monotonic()
        with self._lock:
            elapsed = now - self._last_at
            done = self.processed - self._last_processed
            self._last_processed, self._last_at = self.processed, now
        return done / elapsed if elapsed > 0 else 0.0

    def snapshot(self, in_flight: int, rate: float) -> dict[str, Any]:
        return {
            "processed": self.processed,
            "failed": self.failed,
            "retried": self.retried,
            "dead": self.dead,
            "in_flight": in_flight,
            "rate": round(rate, 1),
        }


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
            REGISTER_WORKER if first else UPSERT_HEARTBEAT,
            [worker_id, hostname, os.getpid(), json.dumps(queues), concurrency, json.dumps(stats)],
        )


def forget(*, alias: str, worker_id: str) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute(DELETE_HEARTBEAT, [worker_id])


def touch_health_file(path: Path, worker_id: str, stats: dict[str, Any]) -> None:
    """Rewrite the health file; its mtime is what a liveness probe checks."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"worker_id": worker_id, "at": time.time(), **stats}))
    tmp.replace(path)
