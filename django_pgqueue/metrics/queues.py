"""The queue gauges, read from the database at scrape time without a ``COUNT(*)`` of any big
table.

Built from the admin dashboard's capped walks (``counts.py``), without its throughput and
failure windows: per queue, ready and scheduled messages walk at most
``cap`` + 1 entries of the claim index per priority, in-flight leases are told from
scheduled messages in the first ``sample`` rows of the future side (plus the small partial
index of leases on their last attempt), dead messages walk ``pgq_dead_died``, and the oldest
ready message is one index probe per priority. A count that stopped at its cap is a lower
bound, said by ``capped``. Three statements per scrape (the queue list, the gauges, the
totals), whatever the number of queues; docs/benchmarks.md gives their cost at 1,000,000 rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction

from ..conf import get_settings
from ..counts import (
    COUNT_CAP,
    DEAD_COUNT,
    LAST_ATTEMPT_LEASES,
    OLDEST_READY_SECONDS,
    QUEUE_PRIORITIES,
    SAMPLE_CAP,
    CappedCount,
    capped_count,
    known_queues,
    live_range,
    live_worker_seconds,
    split_future,
)

__all__ = ["QueueGauges", "Snapshot", "read_gauges"]

GAUGES_SQL = f"""
WITH RECURSIVE {QUEUE_PRIORITIES}
SELECT q.queue,
       (SELECT count(*) FROM ({live_range("<=", "1", "%(cap)s")}) r) AS ready,
       (SELECT count(*) FROM ({live_range(">", "1", "%(cap)s")}) r) AS future_total,
       future.seen, future.leased, last.seen, last.leased,
       {DEAD_COUNT},
       {OLDEST_READY_SECONDS}
FROM unnest(%(queues)s::text[]) AS q(queue)
CROSS JOIN LATERAL (
    SELECT count(*) AS seen, count(*) FILTER (WHERE f.lease_token IS NOT NULL) AS leased
    FROM ({live_range(">", "m.lease_token", "%(sample)s")}) f
) future
{LAST_ATTEMPT_LEASES}
ORDER BY q.queue
"""

# Live workers (heartbeat recent) and the planner's row estimates of the three tables
# (pg_class.reltuples: -1 until the first vacuum or analyze).
TOTALS_SQL = """
SELECT (SELECT count(*) FROM pgqueue_worker
        WHERE last_seen_at > now() - make_interval(secs => %(live_window)s)),
       (SELECT json_object_agg(t.name, c.reltuples::bigint)
        FROM (VALUES ('live', 'pgqueue_message'), ('archive', 'pgqueue_archive'),
                     ('dead', 'pgqueue_dead')) AS t(name, relation)
        JOIN pg_class c ON c.oid = to_regclass(t.relation)
        WHERE c.reltuples >= 0)::text
"""


@dataclass(frozen=True)
class QueueGauges:
    name: str
    paused: bool
    ready: CappedCount
    scheduled: CappedCount
    in_flight: CappedCount
    dead: CappedCount
    oldest_ready_seconds: float  # 0 when nothing is ready


@dataclass(frozen=True)
class Snapshot:
    queues: list[QueueGauges]
    live_workers: int
    estimated_rows: dict[str, int]  # "live", "archive", "dead" -> pg_class.reltuples
    cap: int


def read_gauges(
    *, cap: int = COUNT_CAP, sample: int = SAMPLE_CAP, using: str | None = None
) -> Snapshot:
    """Every queue's gauges, the live workers and the tables' estimated sizes."""
    alias = using or get_settings().DATABASE_ALIAS
    paused = dict(known_queues(using=alias))
    params: dict[str, Any] = {"queues": list(paused), "cap": cap, "sample": sample}
    with transaction.atomic(using=alias, savepoint=False), connections[alias].cursor() as cursor:
        # JIT compilation costs more than these short index walks.
        cursor.execute("SET LOCAL jit = off")
        rows: list[tuple[Any, ...]] = []
        if paused:
            cursor.execute(GAUGES_SQL, params)
            rows = cursor.fetchall()
        cursor.execute(TOTALS_SQL, {"live_window": live_worker_seconds()})
        live_workers, estimates = cursor.fetchone()
    queues = []
    for name, ready, future_total, fut_seen, fut_leased, last_seen, last_leased, dead, age in rows:
        scheduled, in_flight = split_future(
            future_total, fut_seen, fut_leased, last_seen, last_leased, cap=cap, sample=sample
        )
        queues.append(
            QueueGauges(
                name=name,
                paused=paused[name],
                ready=capped_count(ready, cap),
                scheduled=scheduled,
                in_flight=in_flight,
                dead=capped_count(dead, cap),
                oldest_ready_seconds=max(float(age), 0.0) if age is not None else 0.0,
            )
        )
    return Snapshot(
        queues=queues,
        live_workers=int(live_workers),
        estimated_rows={k: int(v) for k, v in json.loads(estimates or "{}").items()},
        cap=cap,
    )
