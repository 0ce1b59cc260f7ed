"""Enqueue: in the caller's transaction, on commit, or in bulk. Everything is validated first."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction

from ..conf import get_settings
from . import sql
from .notify import notify_queues
from .validation import (
    DEDUP_KEY_MAX_LENGTH,
    TENANT_MAX_LENGTH,
    encode_payload,
    validate_delay,
    validate_max_attempts,
    validate_optional_key,
    validate_priority,
    validate_queue_name,
    validate_task_name,
)

__all__ = ["EnqueuedMessage", "enqueue", "enqueue_many", "enqueue_on_commit"]


@dataclass(frozen=True, slots=True)
class EnqueuedMessage:
    """What ``enqueue`` wrote (or found, when ``deduplicated``)."""

    id: int
    queue: str
    task: str
    enqueued_at: datetime
    available_at: datetime
    deduplicated: bool = False


@dataclass(frozen=True, slots=True)
class _Prepared:
    queue: str
    task: str
    payload_json: str
    priority: int
    tenant: str | None
    dedup_key: str | None
    max_attempts: int
    run_at: datetime | None
    delay: float | None


def _prepare(
    task: str,
    payload: Any,
    *,
    queue: str | None,
    priority: int,
    run_after: datetime | timedelta | None,
    dedup_key: str | None,
    max_attempts: int | None,
    tenant: str | None,
) -> _Prepared:
    conf = get_settings()
    queue = validate_queue_name(conf.DEFAULT_QUEUE if queue is None else queue)
    run_at, delay = validate_delay(run_after)
    if max_attempts is None:
        max_attempts = conf.for_queue(queue, "MAX_ATTEMPTS")
    return _Prepared(
        queue=queue,
        task=validate_task_name(task),
        payload_json=encode_payload(payload, conf.MAX_PAYLOAD_BYTES),
        priority=validate_priority(priority),
        tenant=validate_optional_key(tenant, "tenant", TENANT_MAX_LENGTH),
        dedup_key=validate_optional_key(dedup_key, "dedup_key", DEDUP_KEY_MAX_LENGTH),
        max_attempts=validate_max_attempts(max_attempts),
        run_at=run_at,
        delay=delay,
    )


def _write(message: _Prepared, using: str | None) -> EnqueuedMessage:
    conf = get_settings()
    params: list[Any] = [
        message.queue,
        message.task,
        message.payload_json,
        message.priority,
        message.tenant,
        message.dedup_key,
        message.max_attempts,
        message.run_at,
        message.delay or 0.0,
    ]
    if conf.NOTIFY:
        statement = sql.ENQUEUE_AND_NOTIFY
        params += [conf.NOTIFY_CHANNEL, message.queue]
    else:
        statement = sql.ENQUEUE
    with connections[using or conf.DATABASE_ALIAS].cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
        deduplicated = row is None
        if row is None:
            cursor.execute(sql.FIND_BY_DEDUP_KEY, [message.queue, message.dedup_key])
            row = cursor.fetchone()
        if row is None:  # the holder finished between the two statements: enqueue anew
            return _write(message, using)
    return EnqueuedMessage(
        id=row[0],
        queue=message.queue,
        task=message.task,
        enqueued_at=row[1],
        available_at=row[2],
        deduplicated=deduplicated,
    )


def enqueue(
    task: str,
    payload: Any = None,
    *,
    queue: str | None = None,
    priority: int = 0,
    run_after: datetime | timedelta | None = None,
    dedup_key: str | None = None,
    max_attempts: int | None = None,
    tenant: str | None = None,
    using: str | None = None,
) -> EnqueuedMessage:
    """Write one message in the caller's transaction (autocommit when there is none).

    A rollback leaves no message and sends no notification. ``run_after`` is an aware
    datetime or a timedelta added to database time. With ``dedup_key``, a live message of the
    same queue and key is returned instead (``deduplicated=True``). Raises
    :class:`~django_pgqueue.exceptions.InvalidMessage` before writing anything on bad input.
    """
    prepared = _prepare(
        task,
        payload,
        queue=queue,
        priority=priority,
        run_after=run_after,
        dedup_key=dedup_key,
        max_attempts=max_attempts,
        tenant=tenant,
    )
    return _write(prepared, using)


def enqueue_on_commit(
    task: str,
    payload: Any = None,
    *,
    queue: str | None = None,
    priority: int = 0,
    run_after: datetime | timedelta | None = None,
    dedup_key: str | None = None,
    max_attempts: int | None = None,
    tenant: str | None = None,
    using: str | None = None,
) -> None:
    """Enqueue once the surrounding transaction commits (at once when there is none).

    Input is validated now, so a bad call raises here, in the view, not after the commit.
    Prefer :func:`enqueue` when the queue lives in the same database as your data: it is
    atomic with it. Use this when it must not be (e.g. the work reads the committed data
    through another connection).
    """
    prepared = _prepare(
        task,
        payload,
        queue=queue,
        priority=priority,
        run_after=run_after,
        dedup_key=dedup_key,
        max_attempts=max_attempts,
        tenant=tenant,
    )
    alias = using or get_settings().DATABASE_ALIAS
    transaction.on_commit(lambda: _write(prepared, alias), using=alias)


def enqueue_many(
    task: str,
    payloads: Iterable[Any],
    *,
    queue: str | None = None,
    priority: int = 0,
    run_after: datetime | timedelta | None = None,
    dedup_keys: Iterable[str | None] | None = None,
    max_attempts: int | None = None,
    tenant: str | None = None,
    using: str | None = None,
) -> int:
    """Bulk-enqueue one message per payload in ONE statement; returns how many were written.

    Without dedup keys the rows go in by ``COPY``; with them by one multi-row
    ``INSERT ... ON CONFLICT DO NOTHING`` (duplicates of live messages are skipped and not
    counted). Every payload is validated before anything is written; one wake-up is sent.
    """
    keys = list(dedup_keys) if dedup_keys is not None else None
    prepared = [
        _prepare(
            task,
            payload,
            queue=queue,
            priority=priority,
            run_after=run_after,
            dedup_key=keys[i] if keys is not None else None,
            max_attempts=max_attempts,
            tenant=tenant,
        )
        for i, payload in enumerate(payloads)
    ]
    if keys is not None and len(keys) != len(prepared):
        raise ValueError("enqueue_many(): one dedup key per payload")
    return write_prepared(prepared, using=using)


def write_prepared(prepared: list[_Prepared], *, using: str | None = None) -> int:
    if not prepared:
        return 0
    alias = using or get_settings().DATABASE_ALIAS
    connection = connections[alias]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        if any(p.dedup_key is not None for p in prepared):
            cursor.execute(sql.ENQUEUE_MANY_UNNEST, _columns(prepared))
            written = cursor.rowcount
        else:
            written = _copy(cursor.cursor, prepared)
        notify_queues({p.queue for p in prepared}, using=alias)
    return written


def _columns(prepared: list[_Prepared]) -> list[list[Any]]:
    return [
        [p.queue for p in prepared],
        [p.task for p in prepared],
        [p.payload_json for p in prepared],
        [p.priority for p in prepared],
        [p.tenant for p in prepared],
        [p.dedup_key for p in prepared],
        [p.max_attempts for p in prepared],
        [p.run_at for p in prepared],
        [p.delay for p in prepared],
    ]


def _copy(raw_cursor: Any, prepared: list[_Prepared]) -> int:
    """COPY rows straight into the live table; delays are resolved against database time."""
    raw_cursor.execute("SELECT now()")
    db_now: datetime = raw_cursor.fetchone()[0]
    with raw_cursor.copy(sql.ENQUEUE_MANY_COPY) as copy:
        for p in prepared:
            available_at = p.run_at or (db_now + timedelta(seconds=p.delay or 0))
            copy.write_row(
                (
                    p.queue,
                    p.task,
                    p.payload_json,
                    p.priority,
                    p.tenant,
                    p.max_attempts,
                    available_at,
                )
            )
    return len(prepared)
