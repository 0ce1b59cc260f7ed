"""Operator actions (the admin's buttons), each one statement and batch-capable."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction

from ..conf import get_settings
from . import _composition_sql, _sql
from ._notify import notify_queues
from ._validation import validate_queue_name
from .transitions import Outcome, _stale

__all__ = [
    "discard",
    "pause_queue",
    "purge_queue",
    "release_leases",
    "requeue_archived",
    "resume_queue",
    "retry_dead",
    "retry_now",
]


def _run_and_notify(statement: str, params: list[Any], using: str | None) -> list[int]:
    """Run a statement returning ``(id, queue)`` rows and wake the workers of those queues."""
    alias = using or get_settings().DATABASE_ALIAS
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(statement, params)
        rows = cursor.fetchall()
        notify_queues((queue for _, queue in rows), using=alias)
    return [message_id for message_id, _ in rows]


def retry_dead(message_ids: Sequence[int], *, using: str | None = None) -> Outcome:
    """Dead -> live, attempts reset, same message id; a message that died of a failed
    dependency waits again for what it still depends on (released at once when that has
    finished). Ids not moved are in ``stale``: already retried by someone else, or their
    dedup key is held by a live message."""
    ids = list(message_ids)
    alias = using or get_settings().DATABASE_ALIAS
    with transaction.atomic(using=alias):
        with connections[alias].cursor() as cursor:
            cursor.execute(_composition_sql.REWAIT_DEAD, {"ids": ids})
            waiting = [row[0] for row in cursor.fetchall()]
        done = waiting + _run_and_notify(_sql.RETRY_DEAD, [ids], alias)
    return Outcome(done=done, stale=_stale(ids, done))


def retry_now(message_ids: Sequence[int], *, using: str | None = None) -> Outcome:
    """A scheduled or backing-off (not leased) message becomes available now."""
    ids = list(message_ids)
    done = _run_and_notify(_sql.RETRY_NOW, [ids], using)
    return Outcome(done=done, stale=_stale(ids, done))


def release_leases(message_ids: Sequence[int], *, using: str | None = None) -> Outcome:
    """Release leases by id whoever holds them (a stuck worker); its late ack is fenced off."""
    ids = list(message_ids)
    done = _run_and_notify(_sql.RELEASE_BY_ID, [ids], using)
    return Outcome(done=done, stale=_stale(ids, done))


def requeue_archived(archive_ids: Sequence[int], *, using: str | None = None) -> list[int]:
    """Enqueue copies of archived messages (by archive row id); returns the new message ids."""
    return _run_and_notify(_sql.REQUEUE_ARCHIVED, [list(archive_ids)], using)


def discard(
    message_ids: Sequence[int], *, note: str = "discarded by an operator", using: str | None = None
) -> Outcome:
    """Live -> dead with reason ``discarded``."""
    ids = list(message_ids)
    alias = using or get_settings().DATABASE_ALIAS
    with connections[alias].cursor() as cursor:
        cursor.execute(_sql.DISCARD, [ids, note])
        done = [row[0] for row in cursor.fetchall()]
    return Outcome(done=done, stale=_stale(ids, done))


def purge_queue(queue: str, *, using: str | None = None) -> int:
    """Delete every live or waiting message of ``queue``; returns how many. Messages of other
    queues waiting on them are buried (reason ``dependency_failed``)."""
    validate_queue_name(queue)
    alias = using or get_settings().DATABASE_ALIAS
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(_sql.PURGE_QUEUE, {"queue": queue})
        (purged,) = cursor.fetchone()
        if purged:
            cursor.execute(_composition_sql.BURY_DEPENDENTS_OF, {"ids": purged})
        return len(purged or ())


def _set_paused(queue: str, paused: bool, using: str | None) -> None:
    validate_queue_name(queue)
    alias = using or get_settings().DATABASE_ALIAS
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(_sql.SET_PAUSED, [queue, paused])
        if not paused:
            # What is ready now, and when the next of what is scheduled falls due.
            notify_queues([queue], using=alias)
            notify_queues([queue], later=True, using=alias)


def pause_queue(queue: str, *, using: str | None = None) -> None:
    """Stop workers from claiming from ``queue`` (in-flight messages finish)."""
    _set_paused(queue, True, using)


def resume_queue(queue: str, *, using: str | None = None) -> None:
    _set_paused(queue, False, using)
