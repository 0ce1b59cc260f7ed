"""How far composed work has got: waiting messages per queue, open batches, a batch's members
by state and its failed members; for ``pgq_status``, the admin and code.

Every read is bounded whatever the tables hold: waiting messages are counted per queue over
``pgq_waiting_queue`` up to a cap; open batches come newest first over the partial index
``pgq_batch_open``; a batch's counts of finished and dead members are its own row's (kept by
the triggers), and only a batch of at most ``MEMBER_SCAN_CAP`` members is walked to split the
rest into live and waiting.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections

from ..conf import get_settings
from ..core._composition_models import Batch
from ..counts import COUNT_CAP, CappedCount, capped_count

__all__ = [
    "MEMBER_SCAN_CAP",
    "OPEN_BATCHES_SHOWN",
    "BatchProgress",
    "FailedMember",
    "MemberStates",
    "batch_state",
    "failed_members",
    "member_states",
    "open_batches",
    "waiting_by_queue",
]

#: ``pgq_status`` and the admin list at most this many open batches, the newest first.
OPEN_BATCHES_SHOWN = 20
#: A batch with at most this many members has its unfinished ones split into live and waiting.
MEMBER_SCAN_CAP = 10_000

# The distinct queues of the waiting table (one index probe each), then a capped count each.
WAITING_BY_QUEUE = """
WITH RECURSIVE queues(queue) AS (
    (SELECT queue FROM pgqueue_waiting ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM pgqueue_waiting w WHERE w.queue > queues.queue
            ORDER BY w.queue LIMIT 1)
    FROM queues WHERE queues.queue IS NOT NULL
)
SELECT q.queue,
       (SELECT count(*) FROM (SELECT 1 FROM pgqueue_waiting w WHERE w.queue = q.queue
                              LIMIT %(cap)s + 1) c)
FROM queues q
WHERE q.queue IS NOT NULL AND (cardinality(%(queues)s::text[]) = 0 OR q.queue = ANY(%(queues)s))
ORDER BY q.queue
"""

OPEN_BATCHES = """
SELECT id, label, total, succeeded, failed, created_at
FROM pgqueue_batch WHERE completed_at IS NULL
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s
"""

OPEN_BATCH_COUNT = """
SELECT count(*) FROM (SELECT 1 FROM pgqueue_batch WHERE completed_at IS NULL
                      LIMIT %(cap)s + 1) b
"""

# Where each member of one (small) batch is now, among those not counted by the batch's row.
UNFINISHED_MEMBERS = """
SELECT count(*) FILTER (WHERE EXISTS (SELECT 1 FROM pgqueue_message m WHERE m.id = bm.message_id)),
       count(*) FILTER (WHERE EXISTS (SELECT 1 FROM pgqueue_waiting w
                                      WHERE w.id = bm.message_id))
FROM pgqueue_batch_member bm
WHERE bm.batch_id = %(batch)s
"""

# A batch's dead members, in message id order; each probe of the dead table is by its unique
# message_id.
FAILED_MEMBERS = """
SELECT d.id, d.message_id, d.task, d.queue, d.reason, d.details ->> 'type',
       left(d.details ->> 'message', 500), d.details ->> 'dependency',
       -- NULL outside what Python can hold (a row written by SQL)
       CASE WHEN d.died_at BETWEEN '0001-01-02' AND '9999-12-30' THEN d.died_at END
FROM pgqueue_batch_member bm JOIN pgqueue_dead d ON d.message_id = bm.message_id
WHERE bm.batch_id = %(batch)s
ORDER BY d.message_id
LIMIT %(limit)s
"""


def _alias(using: str | None) -> str:
    return using or get_settings().DATABASE_ALIAS


def batch_state(batch: Batch | BatchProgress) -> str:
    """``running``, ``succeeded``, ``failed`` (complete with dead members) or ``retrying``
    (complete with dead members once, every one of them back since)."""
    completed_at = getattr(batch, "completed_at", None)
    if getattr(batch, "succeeded_at", None) is not None:
        return "succeeded"
    if completed_at is None:
        return "running"
    return "failed" if batch.failed else "retrying"


@dataclass(frozen=True)
class BatchProgress:
    """One batch's counts as its row keeps them."""

    id: int
    label: str
    total: int
    succeeded: int
    failed: int
    created_at: dt.datetime | None

    @property
    def pending(self) -> int:
        return self.total - self.succeeded - self.failed

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "label": self.label,
            "total": self.total,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "pending": self.pending,
            "created_at": self.created_at.isoformat() if self.created_at else None,
        }


def open_batches(
    *, limit: int = OPEN_BATCHES_SHOWN, cap: int = COUNT_CAP, using: str | None = None
) -> tuple[list[BatchProgress], CappedCount]:
    """The newest ``limit`` batches not complete yet, and how many there are (capped)."""
    with connections[_alias(using)].cursor() as cursor:
        cursor.execute(OPEN_BATCHES, {"limit": limit})
        batches = [BatchProgress(*row) for row in cursor.fetchall()]
        cursor.execute(OPEN_BATCH_COUNT, {"cap": cap})
        (count,) = cursor.fetchone()
    return batches, capped_count(count, cap)


def waiting_by_queue(
    *, queues: Sequence[str] = (), cap: int = COUNT_CAP, using: str | None = None
) -> dict[str, CappedCount]:
    """Messages waiting on dependencies or on their batch, per queue (capped counts)."""
    with connections[_alias(using)].cursor() as cursor:
        cursor.execute(WAITING_BY_QUEUE, {"cap": cap, "queues": list(queues)})
        return {queue: capped_count(count, cap) for queue, count in cursor.fetchall()}


@dataclass(frozen=True)
class MemberStates:
    """Where a batch's members are. ``live`` and ``waiting`` are ``None`` for a batch of more
    than ``MEMBER_SCAN_CAP`` members: only their sum, ``pending``, is known."""

    finished: int
    dead: int
    pending: int
    live: int | None = None
    waiting: int | None = None


def member_states(batch: Batch, *, using: str | None = None) -> MemberStates:
    """The batch's members by state: finished and dead from its row, live and waiting read
    for a batch of at most ``MEMBER_SCAN_CAP`` members with some unfinished."""
    states = MemberStates(finished=batch.succeeded, dead=batch.failed, pending=batch.pending)
    if not batch.pending:
        return MemberStates(batch.succeeded, batch.failed, 0, live=0, waiting=0)
    if batch.total > MEMBER_SCAN_CAP:
        return states
    with connections[_alias(using)].cursor() as cursor:
        cursor.execute(UNFINISHED_MEMBERS, {"batch": batch.id})
        live, waiting = cursor.fetchone()
    return MemberStates(
        finished=batch.succeeded, dead=batch.failed, pending=batch.pending, live=live,
        waiting=waiting,
    )  # fmt: skip


@dataclass(frozen=True)
class FailedMember:
    """A batch member in the dead table."""

    dead_id: int  # the dead row's id (its admin page)
    message_id: int
    task: str
    queue: str
    reason: str
    error_type: str | None
    error_message: str | None
    # For reason ``dependency_failed``: the failed message it depended on.
    dependency: int | None
    died_at: dt.datetime | None


def failed_members(
    batch: Batch, *, limit: int = 50, using: str | None = None
) -> list[FailedMember]:
    """At most ``limit`` of the batch's dead members, in message id order (none read when
    its row counts none)."""
    if not batch.failed:
        return []
    with connections[_alias(using)].cursor() as cursor:
        cursor.execute(FAILED_MEMBERS, {"batch": batch.id, "limit": limit})
        rows = cursor.fetchall()
    return [
        FailedMember(
            dead_id=dead_id,
            message_id=message_id,
            task=task,
            queue=queue,
            reason=reason,
            error_type=error_type,
            error_message=error_message,
            dependency=_int_or_none(dependency),
            died_at=died_at,
        )
        for (dead_id, message_id, task, queue, reason, error_type, error_message, dependency,
             died_at) in rows
    ]  # fmt: skip


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
