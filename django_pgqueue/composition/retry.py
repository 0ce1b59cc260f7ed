"""Retry a batch's failed members through the dead letters' retry (``operations.retry_dead``).

A member that died of its own error is retried itself. One that died because a message it
depends on failed (reason ``dependency_failed``: a chain's last step after an earlier step
died) is brought back by retrying that failed message: the triggers then revive the steps
after it into the waiting table, and count the member back (retrying the member alone would
only make it wait for that one again). Either way the batch's ``failed`` count goes down as they
come back, and its success callback runs once every member has finished.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from django.db import connections

from ..conf import get_settings
from ..core import operations

__all__ = ["RETRY_BATCH", "RETRY_LIMIT", "MemberRetry", "retry_failed_members"]

#: At most this many dead members are read per call; the rest wait for the next one.
RETRY_LIMIT = 10_000
#: Messages retried per statement (one short transaction each).
RETRY_BATCH = 1_000
# A message buried at enqueue for a dependency dead already names that one, which may have
# died of a dependency in turn: followed this many steps at most.
CAUSE_DEPTH = 20

DEAD_MEMBERS = """
SELECT bm.batch_id, d.message_id, d.reason, d.details ->> 'dependency'
FROM pgqueue_batch_member bm JOIN pgqueue_dead d ON d.message_id = bm.message_id
WHERE bm.batch_id = ANY(%(batches)s)
ORDER BY d.message_id
LIMIT %(limit)s + 1
"""

DEAD_CAUSES = """
SELECT message_id, reason, details ->> 'dependency'
FROM pgqueue_dead WHERE message_id = ANY(%(ids)s)
"""


@dataclass
class MemberRetry:
    """What :func:`retry_failed_members` did."""

    # Dead messages moved back to the live table: members, and the failed messages that
    # members depended on.
    retried: list[int] = field(default_factory=list)
    # Dead members brought back (by their own retry or their dependency's).
    members: list[int] = field(default_factory=list)
    # Dead members not brought back: their failed dependency is no longer in the dead table
    # (deleted), or its retry was refused (someone retried it meanwhile, or a live message
    # holds its dedup key).
    skipped: list[int] = field(default_factory=list)
    # The batches with a member brought back.
    batches: set[int] = field(default_factory=set)
    # More dead members than the limit: call again for the rest.
    truncated: bool = False


def _cause(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _chunks(ids: Sequence[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), RETRY_BATCH):
        yield list(ids[start : start + RETRY_BATCH])


def retry_failed_members(
    batch_ids: Sequence[int], *, limit: int = RETRY_LIMIT, using: str | None = None
) -> MemberRetry:
    """Bring the dead members of the batches back (see the module's docstring)."""
    alias = using or get_settings().DATABASE_ALIAS
    outcome = MemberRetry()
    with connections[alias].cursor() as cursor:
        cursor.execute(DEAD_MEMBERS, {"batches": list(batch_ids), "limit": limit})
        rows = cursor.fetchall()
        outcome.truncated = len(rows) > limit
        rows = rows[:limit]
        # member -> the dead message whose retry brings it back
        root: dict[int, int] = {}
        batch_of_member = {member: batch for batch, member, _, _ in rows}
        unresolved: dict[int, int] = {}  # member -> the dependency to look for
        for _, member, reason, dependency in rows:
            cause = _cause(dependency) if reason == "dependency_failed" else None
            if cause is None:
                root[member] = member
            else:
                unresolved[member] = cause
        for _ in range(CAUSE_DEPTH):
            if not unresolved:
                break
            cursor.execute(DEAD_CAUSES, {"ids": sorted(set(unresolved.values()))})
            found = {m: (reason, _cause(dep)) for m, reason, dep in cursor.fetchall()}
            following: dict[int, int] = {}
            for member, cause in unresolved.items():
                if cause not in found:
                    outcome.skipped.append(member)
                    continue
                reason, further = found[cause]
                if reason == "dependency_failed" and further is not None:
                    following[member] = further
                else:
                    root[member] = cause
            unresolved = following
        outcome.skipped.extend(unresolved)
    wanted = sorted(set(root.values()))
    done: set[int] = set()
    for chunk in _chunks(wanted):
        done.update(operations.retry_dead(chunk, using=alias).done)
    outcome.retried = sorted(done)
    for member, cause in sorted(root.items()):
        if cause in done:
            outcome.members.append(member)
            outcome.batches.add(batch_of_member[member])
        else:
            outcome.skipped.append(member)
    outcome.skipped.sort()
    return outcome
