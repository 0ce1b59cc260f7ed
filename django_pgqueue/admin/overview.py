"""The numbers on the admin dashboard, read without a full ``COUNT(*)`` of any big table.

Every count here is *capped*: it walks at most ``cap + 1`` entries of an index range and
reports ``capped=True`` when there were more, so a page view costs the same with a thousand
or ten million rows. The ranges are contiguous in the existing indexes:

- live messages, per (queue, priority) found by a skip scan over ``pgq_message_claim``:
  ``available_at <= now()`` (ready) and ``available_at > now()`` (scheduled or leased);
- leases on their last attempt, over the small partial index ``pgq_message_exhausted``;
- ``pgq_dead_died (queue, died_at)`` and ``pgq_archive_finished (queue, finished_at)`` for
  the dead count and the 5 / 60 minute throughput;
- failed attempts in the last 5 / 60 minutes, read from the ``errors`` entries (one per
  failed attempt, with its time) of the rows that can hold recent ones: dead rows that died
  in the window, archived rows finished in it and live rows with errors, the last two over
  the small partial indexes ``pgq_archive_failed`` and ``pgq_message_failed``. A retry of
  a dead message carries its errors along, so it never erases a failure from the count.

Nothing the database may hold (an infinite or far-future timestamp, JSON Python cannot
decode) reaches Python as such: ages are computed in SQL as seconds, timestamps outside
Python's range arrive as NULL, JSON as text decoded with a fallback.

The whole dashboard is five statements, however many queues there are. The walks it shares
with ``pgq_status`` and the metrics live in ``counts.py``.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from ..conf import get_settings
from ..counts import (
    COUNT_CAP,
    SAMPLE_CAP,
    CappedCount,
    capped_count,
    capped_part,
    known_queues,
    live_worker_seconds,
    split_future,
)
from ..models import ARCHIVE_TABLE, DEAD_TABLE, MESSAGE_TABLE
from . import sql
from .columns import SAFE_TIMESTAMP_RANGE, decode_json
from .display import LONGEST_AGE, activity_items, short_duration

__all__ = [
    "COUNT_CAP",
    "SAMPLE_CAP",
    "THROUGHPUT_CAP",
    "CappedCount",
    "Overview",
    "QueueOverview",
    "TableSize",
    "WorkerOverview",
    "known_queues",
    "live_worker_seconds",
    "read_overview",
]

# Throughput windows are index-only range scans, cheap enough to count further.
THROUGHPUT_CAP = 100_000
# Failed attempts are read from this many rows' errors per queue and table at most; beyond
# it the count is a lower bound.
FAILURE_ROWS_CAP = SAMPLE_CAP


@dataclass
class QueueOverview:
    name: str
    paused: bool
    ready: CappedCount
    scheduled: CappedCount
    in_flight: CappedCount
    retrying: CappedCount
    dead: CappedCount
    oldest_ready_age: dt.timedelta | None
    processed_5m: CappedCount
    processed_60m: CappedCount
    failed_5m: CappedCount
    failed_60m: CappedCount

    @property
    def oldest_ready(self) -> str:
        return short_duration(self.oldest_ready_age) if self.oldest_ready_age else "—"


@dataclass(frozen=True)
class TableSize:
    """A table's row count: exact up to the cap, else the planner's estimate when it has one
    (``pg_class.reltuples``, refreshed by (auto)vacuum and analyze)."""

    counted: CappedCount | None
    estimate: int | None

    def __str__(self) -> str:
        if self.counted is not None and not self.counted.capped:
            return str(self.counted)
        if self.estimate is not None and (
            self.counted is None or self.estimate > self.counted.value
        ):
            return f"about {self.estimate:,} (planner estimate)"
        return str(self.counted) if self.counted is not None else "not yet analyzed"


@dataclass
class WorkerOverview:
    worker_id: str
    hostname: str
    pid: int | None
    queues: list[str]
    concurrency: int
    # None when the stored value is outside what Python can hold.
    started_at: dt.datetime | None
    last_seen_at: dt.datetime | None
    seen_ago: dt.timedelta
    stats: dict[str, Any]

    @property
    def seen(self) -> str:
        return short_duration(self.seen_ago)

    @property
    def activity(self) -> list[tuple[str, str]]:
        """The heartbeat's counters as ``(label, value)``, in a fixed order."""
        return activity_items(self.stats)


@dataclass
class Overview:
    now: dt.datetime
    queues: list[QueueOverview] = field(default_factory=list)
    workers: list[WorkerOverview] = field(default_factory=list)
    # pg_class.reltuples of the tables the planner has estimated (after a vacuum or analyze).
    estimated_rows: dict[str, int] = field(default_factory=dict)
    # "live", "archive", "dead": each table's size as the dashboard says it.
    table_sizes: dict[str, TableSize] = field(default_factory=dict)


def _json(value: Any) -> Any:
    """Django reads jsonb as text through raw cursors (its fields decode it themselves);
    None for what Python cannot decode."""
    if isinstance(value, bytes):
        value = value.decode()
    if not isinstance(value, str):
        return value
    decoded, ok = decode_json(value)
    return decoded if ok else None


def _age(seconds: float | None) -> dt.timedelta | None:
    """An age in seconds as a timedelta, however large (an infinite one included)."""
    if seconds is None:
        return None
    if not math.isfinite(seconds) or seconds >= LONGEST_AGE.total_seconds():
        return LONGEST_AGE if seconds > 0 else dt.timedelta(0)
    return dt.timedelta(seconds=max(seconds, 0.0))


def read_overview(
    *,
    cap: int = COUNT_CAP,
    sample: int = SAMPLE_CAP,
    throughput_cap: int = THROUGHPUT_CAP,
    failure_rows: int = FAILURE_ROWS_CAP,
    using: str | None = None,
) -> Overview:
    """Everything the dashboard shows, in five statements."""
    alias = using or get_settings().DATABASE_ALIAS
    queues = known_queues(using=alias)
    paused = dict(queues)
    params: dict[str, Any] = {
        "queues": list(paused),
        "cap": cap,
        "sample": sample,
        "throughput_cap": throughput_cap,
        "failure_rows": failure_rows,
    }
    low, high = SAFE_TIMESTAMP_RANGE
    with transaction.atomic(using=alias, savepoint=False), connections[alias].cursor() as cursor:
        # JIT compilation costs more than these short index walks; off for this transaction.
        cursor.execute(sql.JIT_OFF)
        cursor.execute(sql.STATS, params)
        rows = cursor.fetchall()
        cursor.execute(sql.SIZES, {"cap": cap})
        size_rows = cursor.fetchall()
        cursor.execute(
            sql.WORKERS, {"low": low, "high": high, "live_window": live_worker_seconds()}
        )
        worker_rows = cursor.fetchall()
        if not rows:
            cursor.execute(sql.NOW)
            now = cursor.fetchone()[0]
    overview = Overview(now=rows[0][-1] if rows else now)
    for name, estimate, counted in size_rows:
        table = {"live": MESSAGE_TABLE, "archive": ARCHIVE_TABLE, "dead": DEAD_TABLE}[name]
        if estimate >= 0:
            overview.estimated_rows[table] = int(estimate)
        overview.table_sizes[name] = TableSize(
            counted=capped_count(counted, cap) if counted is not None else None,
            estimate=int(estimate) if estimate >= 0 else None,
        )
    for row in rows:
        (name, due_total, future_total, due_seen, due_retrying, fut_seen, fut_leased,
         fut_retrying, last_seen, last_leased, dead, oldest_seconds, done5, done60, failed5,
         failed60, failure_rows_walked, now) = row  # fmt: skip
        failures_capped = (failure_rows_walked or 0) > failure_rows
        scheduled, in_flight = split_future(
            future_total, fut_seen, fut_leased, last_seen, last_leased, cap=cap, sample=sample
        )
        overview.queues.append(
            QueueOverview(
                name=name,
                paused=paused[name],
                ready=capped_count(due_total, cap),
                scheduled=scheduled,
                in_flight=in_flight,
                retrying=capped_part(due_retrying, due_seen, sample)
                + capped_part(fut_retrying, fut_seen, sample),
                dead=capped_count(dead, cap),
                oldest_ready_age=_age(oldest_seconds),
                processed_5m=capped_count(done5, throughput_cap),
                processed_60m=capped_count(done60, throughput_cap),
                failed_5m=CappedCount(int(failed5), failures_capped),
                failed_60m=CappedCount(int(failed60), failures_capped),
            )
        )
    for row in worker_rows:
        worker_id, hostname, pid, worker_queues, concurrency, started, seen, ago, stats = row
        worker_queues, stats = _json(worker_queues), _json(stats)
        overview.workers.append(
            WorkerOverview(
                worker_id=worker_id,
                hostname=hostname,
                pid=pid,
                queues=sorted(str(q) for q in worker_queues)
                if isinstance(worker_queues, list)
                else [],
                concurrency=concurrency,
                started_at=started,
                last_seen_at=seen,
                seen_ago=_age(ago) or dt.timedelta(0),
                stats=stats if isinstance(stats, dict) else {},
            )
        )
    return overview
