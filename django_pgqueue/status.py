"""The queues' health in one read, for ``manage.py pgq_status`` and for cron alerts.

Built on the admin dashboard's capped counts (``admin/overview.py``): each count walks at most
``COUNT_CAP`` + 1 entries of an index range and says "N+" beyond, so a status check costs the
same with a thousand or ten million rows. Dead messages by reason read the newest
``COUNT_CAP`` dead rows of each queue through ``pgq_dead_died``: exact while a queue holds fewer.
Composed work comes from ``composition/progress.py``: messages waiting on dependencies or on
their batch per queue (capped counts), and the newest ``OPEN_BATCHES_SHOWN`` batches not
complete yet with their counts.
The progress of running messages reads ``pgqueue_progress``, which holds a row only per
message whose handler reports progress, and shows at most ``PROGRESS_ROWS`` of them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from .admin import sql as admin_sql
from .admin.overview import COUNT_CAP, CappedCount, Overview, live_worker_seconds, read_overview
from .composition.progress import BatchProgress, open_batches, waiting_by_queue
from .conf import get_settings
from .core._progress import RunningProgress, running_progress

__all__ = ["PROGRESS_ROWS", "Status", "Thresholds", "read_status"]

#: Most running messages whose progress a status shows.
PROGRESS_ROWS = 50


@dataclass(frozen=True)
class Thresholds:
    """Limits that make the status a problem (``None``: not checked)."""

    max_oldest_ready: float | None = None  # seconds a ready message of an unpaused queue waits
    max_dead: int | None = None  # dead messages in any one queue
    min_workers: int | None = None  # live workers (heartbeat recent)


@dataclass
class Status:
    overview: Overview
    dead_by_reason: dict[str, dict[str, int]]
    problems: list[str] = field(default_factory=list)
    # Messages waiting on dependencies or on their batch, per queue that has some.
    waiting: dict[str, CappedCount] = field(default_factory=dict)
    # The newest batches not complete yet, and how many there are.
    open_batches: list[BatchProgress] = field(default_factory=list)
    open_batch_count: CappedCount = field(default_factory=lambda: CappedCount(0))
    #: Running messages that reported progress (at most ``PROGRESS_ROWS``), by id.
    progress: list[RunningProgress] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        def count(value: CappedCount) -> dict[str, Any]:
            return {"value": value.value, "capped": value.capped}

        def seconds(delta: dt.timedelta | None) -> float | None:
            return None if delta is None else round(delta.total_seconds(), 3)

        return {
            "now": self.overview.now.isoformat(),
            "count_cap": COUNT_CAP,
            "ok": self.ok,
            "problems": self.problems,
            "queues": [
                {
                    "name": q.name,
                    "paused": q.paused,
                    "ready": count(q.ready),
                    "scheduled": count(q.scheduled),
                    "in_flight": count(q.in_flight),
                    "retrying": count(q.retrying),
                    "dead": count(q.dead),
                    "waiting": count(self.waiting.get(q.name, CappedCount(0))),
                    "dead_by_reason": self.dead_by_reason.get(q.name, {}),
                    "oldest_ready_seconds": seconds(q.oldest_ready_age),
                    "processed_5m": count(q.processed_5m),
                    "failed_5m": count(q.failed_5m),
                }
                for q in self.overview.queues
            ],
            "workers": [
                {
                    "worker_id": w.worker_id,
                    "hostname": w.hostname,
                    "pid": w.pid,
                    "queues": w.queues,
                    "concurrency": w.concurrency,
                    "last_seen_seconds": seconds(w.seen_ago),
                    "started_at": w.started_at.isoformat() if w.started_at else None,
                    "stats": w.stats,
                }
                for w in self.overview.workers
            ],
            "live_worker_seconds": live_worker_seconds(),
            "waiting": {queue: count(value) for queue, value in self.waiting.items()},
            "open_batches": {
                "count": count(self.open_batch_count),
                "newest": [batch.as_json() for batch in self.open_batches],
            },
            "progress": [
                {
                    "message_id": p.progress.message_id,
                    "queue": p.queue,
                    "task": p.task,
                    "done": p.progress.done,
                    "total": p.progress.total,
                    "note": p.progress.note,
                    "updated_seconds_ago": round(p.age_seconds, 3),
                }
                for p in self.progress
            ],
        }


def _problems(overview: Overview, thresholds: Thresholds) -> list[str]:
    problems = []
    for q in overview.queues:
        age = q.oldest_ready_age
        limit = thresholds.max_oldest_ready
        if limit is not None and not q.paused and age is not None and age.total_seconds() > limit:
            problems.append(
                f"queue {q.name}: the oldest ready message has waited "
                f"{age.total_seconds():.0f}s (more than {limit:g}s)"
            )
        if thresholds.max_dead is not None and q.dead.value > thresholds.max_dead:
            problems.append(
                f"queue {q.name}: {q.dead} dead messages (more than {thresholds.max_dead})"
            )
    workers = len(overview.workers)
    if thresholds.min_workers is not None and workers < thresholds.min_workers:
        problems.append(f"{workers} live workers (fewer than {thresholds.min_workers})")
    return problems


def read_status(
    *,
    queues: Sequence[str] = (),
    thresholds: Thresholds | None = None,
    using: str | None = None,
) -> Status:
    """The overview of every queue (or of ``queues``), dead by reason, and what crossed a
    threshold."""
    alias = using or get_settings().DATABASE_ALIAS
    overview = read_overview(using=alias)
    if queues:
        wanted = set(queues)
        overview.queues = [q for q in overview.queues if q.name in wanted]
    dead_by_reason: dict[str, dict[str, int]] = {}
    with_dead = [q.name for q in overview.queues if q.dead.value]
    if with_dead:
        with connections[alias].cursor() as cursor:
            cursor.execute(admin_sql.DEAD_BY_REASON, {"queues": with_dead, "cap": COUNT_CAP})
            for queue, reason, count in cursor.fetchall():
                dead_by_reason.setdefault(queue, {})[reason] = count
    batches, open_count = open_batches(using=alias)
    status = Status(
        overview=overview,
        dead_by_reason=dead_by_reason,
        waiting=waiting_by_queue(queues=queues, using=alias),
        open_batches=batches,
        open_batch_count=open_count,
        progress=running_progress(queues=queues, limit=PROGRESS_ROWS, using=alias),
    )
    status.problems = _problems(overview, thresholds or Thresholds())
    return status
