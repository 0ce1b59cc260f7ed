"""Enqueue: in the caller's transaction, on commit, or in bulk. Everything is validated first."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, TypedDict, Unpack

import psycopg
from django.db import IntegrityError, connections, transaction

from .. import tracing
from ..conf import get_settings
from ..exceptions import DependencyError, InvalidMessage
from . import _bulk, _enqueue_control, _json, _send, _sql
from ._dependencies import dependency_ids, write_held, write_waiting
from ._execution import CLAIM_PLAN
from ._flow_control import flow_config
from ._headers import encode_headers, validate_headers
from ._notify import notify_queues, wake_payload
from ._registry import registry
from ._validation import (
    DEDUP_KEY_MAX_LENGTH,
    TENANT_MAX_LENGTH,
    encode_payload,
    validate_delay,
    validate_duration,
    validate_max_attempts,
    validate_optional_key,
    validate_priority,
    validate_queue_name,
    validate_task_name,
)

__all__ = [
    "EnqueuedMessage",
    "MessageOptions",
    "PreparedMessage",
    "enqueue",
    "enqueue_many",
    "enqueue_on_commit",
    "prepare_message",
    "write_message",
]


@dataclass(frozen=True, slots=True)
class EnqueuedMessage:
    """What ``enqueue`` wrote (or found, when ``deduplicated``)."""

    id: int
    queue: str
    task: str
    enqueued_at: datetime
    #: ``None`` while it waits for its dependencies (``after=``).
    available_at: datetime | None
    deduplicated: bool = False


# Not frozen: a frozen dataclass's ``__init__`` sets each field through
# ``object.__setattr__``, a tenth of ``enqueue()``'s own Python. Nothing changes one once
# made: ``dataclasses.replace`` makes another.
@dataclass(slots=True)
class PreparedMessage:
    """A message that passed every check, ready to be written (:func:`write_message`)."""

    queue: str
    task: str
    payload_json: str
    priority: int
    tenant: str | None
    dedup_key: str | None
    max_attempts: int
    run_at: datetime | None
    delay: float | None
    #: Message ids it runs after (``after=``), each finished successfully.
    after: tuple[int, ...] = ()
    #: A batch's member: its archiving or burial is counted (``_composition_sql.py``).
    composed: bool = False
    #: Job control (``_enqueue_control.py``): seconds, or None.
    unique_for: float | None = None
    debounce: float | None = None
    #: The headers' JSON text (``_headers.py``), None when there are none.
    headers_json: str | None = None

    @property
    def later(self) -> bool:
        """Scheduled (``run_after``): its wake-up says so (``_notify.py``). A time in the past
        counts too: the worker's lookup finds it due at once."""
        return self.run_at is not None or bool(self.delay and self.delay > 0)


class MessageOptions(TypedDict, total=False):
    """What :func:`enqueue` and :func:`enqueue_on_commit` take beside the task and payload."""

    #: The queue (default: the task's registered handler's, then ``DEFAULT_QUEUE``).
    queue: str | None
    #: Larger runs sooner, from -100 to 100 (default 0).
    priority: int
    #: An aware datetime, or a timedelta added to database time.
    run_after: datetime | timedelta | None
    #: A live message of the same queue and key is returned instead (``deduplicated=True``).
    dedup_key: str | None
    #: Runs before the message is dead (default: the handler's, then ``MAX_ATTEMPTS``).
    max_attempts: int | None
    #: The fairness and limit key.
    tenant: str | None
    #: Messages (ids, or what enqueue returned) that must finish successfully first; with
    #: ``run_after`` as a timedelta, counted from when the last of them finished.
    after: Iterable[Any] | None
    #: With ``dedup_key``: for this long after the first enqueue of the key (seconds or a
    #: timedelta), whether that message still waits, runs, finished or died, an enqueue of
    #: the key with ``unique_for`` returns it (``deduplicated=True``).
    unique_for: timedelta | float | None
    #: With ``dedup_key``: the key's message that has not started takes this payload and
    #: starts this long from now (``deduplicated=True``); else a new message starts then.
    debounce: timedelta | float | None
    #: A small dict of strings the handler reads as ``context.headers`` (``_headers.py``).
    headers: dict[str, str] | None


def prepare_message(
    task: str,
    payload: Any,
    *,
    queue: str | None = None,
    priority: int = 0,
    run_after: datetime | timedelta | None = None,
    dedup_key: str | None = None,
    max_attempts: int | None = None,
    tenant: str | None = None,
    after: Iterable[Any] | None = None,
    unique_for: timedelta | float | None = None,
    debounce: timedelta | float | None = None,
    headers: dict[str, str] | None = None,
) -> PreparedMessage:
    """Check everything ``enqueue`` takes, before any SQL: :class:`InvalidMessage` (or a
    subclass) naming what is wrong. The one validation of every enqueue path."""
    conf = get_settings()
    registered = registry.get(task) if isinstance(task, str) else None
    if registered is not None:
        # A registered handler's options are the defaults of its messages.
        queue = registered.queue if queue is None else queue
        max_attempts = registered.max_attempts if max_attempts is None else max_attempts
    queue = validate_queue_name(conf.DEFAULT_QUEUE if queue is None else queue)
    run_at, delay = validate_delay(run_after)
    if max_attempts is None:
        max_attempts = conf.for_queue(queue, "MAX_ATTEMPTS")
    dependencies = () if after is None else dependency_ids(after)
    if dependencies and dedup_key is not None:
        # Its key would be claimed only at its release, in the statement that finishes its
        # last dependency, where a duplicate could only fail that statement.
        raise DependencyError("a message with dependencies (after=) cannot have a dedup_key")
    unique_seconds, debounce_seconds = _job_control(unique_for, debounce, dedup_key, run_after)
    return PreparedMessage(
        queue=queue,
        task=validate_task_name(task),
        payload_json=encode_payload(payload, conf.MAX_PAYLOAD_BYTES),
        priority=validate_priority(priority),
        tenant=validate_optional_key(tenant, "tenant", TENANT_MAX_LENGTH),
        dedup_key=validate_optional_key(dedup_key, "dedup_key", DEDUP_KEY_MAX_LENGTH),
        max_attempts=validate_max_attempts(max_attempts),
        run_at=run_at,
        delay=delay,
        after=dependencies,
        unique_for=unique_seconds,
        debounce=debounce_seconds,
        # The current trace context joins them (``tracing.py``), when a span is active.
        headers_json=encode_headers(tracing.inject(validate_headers(headers))),
    )


def _job_control(
    unique_for: object, debounce: object, dedup_key: object, run_after: object
) -> tuple[float | None, float | None]:
    """``unique_for`` and ``debounce`` in seconds, after their checks."""
    if unique_for is None and debounce is None:
        return None, None
    if unique_for is not None and debounce is not None:
        raise InvalidMessage("unique_for and debounce exclude each other: pass one of them.")
    what = "unique_for" if unique_for is not None else "debounce"
    if dedup_key is None:
        raise InvalidMessage(f"{what} needs a dedup_key: the key it applies to.")
    if debounce is not None and run_after is not None:
        raise InvalidMessage("debounce sets when the message starts: do not pass run_after.")
    if unique_for is not None:
        return validate_duration(unique_for, "unique_for"), None
    return None, validate_duration(debounce, "debounce")


def _params(message: PreparedMessage) -> dict[str, Any]:
    """The enqueue statements' parameters (``_sql.ENQUEUE``,
    ``_composition_sql.INSERT_WAITING``)."""
    conf = get_settings()
    flow = flow_config(message.queue)
    fair = flow is not None and flow.keyed
    return {
        "queue": message.queue,
        "task": message.task,
        "payload": message.payload_json,
        "headers": message.headers_json,
        "priority": message.priority,
        "tenant": message.tenant,
        "dedup_key": message.dedup_key,
        "max_attempts": message.max_attempts,
        "composed": message.composed,
        "run_at": message.run_at,
        "delay": float(message.delay or 0.0),
        "channel": conf.NOTIFY_CHANNEL if conf.NOTIFY else None,
        "wake": wake_payload(message.queue, later=message.later) if conf.NOTIFY else None,
        "fair": fair,
        # A fair queue's message takes its place in the fair order by its tenant's step.
        "step": flow.fair_step(message.tenant) if flow is not None and fair else None,
    }


def hold_message(message: PreparedMessage, using: str) -> EnqueuedMessage:
    """Write a message that waits until something else releases it (a batch's callback)."""
    message_id, enqueued_at = write_held(_params(message), using)
    return EnqueuedMessage(
        id=message_id,
        queue=message.queue,
        task=message.task,
        enqueued_at=enqueued_at,
        available_at=None,
    )


def write_message(message: PreparedMessage, using: str | None) -> EnqueuedMessage:
    if message.unique_for is not None or message.debounce is not None:
        return _write_controlled(message, using)
    conf = get_settings()
    params = _params(message)
    if message.after:
        message_id, enqueued_at, available_at = write_waiting(
            params, message.after, using or conf.DATABASE_ALIAS
        )
        return EnqueuedMessage(
            id=message_id,
            queue=message.queue,
            task=message.task,
            enqueued_at=enqueued_at,
            available_at=available_at,
        )
    fair = params["fair"]
    dedup = message.dedup_key is not None
    statement = _ENQUEUE_STATEMENTS[fair, dedup]
    connection = connections[using or conf.DATABASE_ALIAS]
    row = None
    if _send.direct(connection):
        # A fair queue's INSERT reads the fair order (``_sql.FAIR_ORDER_ENTRY``): under the
        # claim's plan settings, as a generic plan made while the table was empty would read
        # it by sequential scans, O(table) per enqueue once the table has grown.
        rows = _send.run(connection, statement, params, plan=CLAIM_PLAN if fair else None)
        if rows:  # else fallen back, or a duplicate: _insert finds the holder
            row = (*rows[0][:3], False)
    if row is None:
        row = _insert(connection, statement, params, dedup)
    if row is None:  # the holder finished between the two statements: enqueue anew
        return write_message(message, using)
    return EnqueuedMessage(
        id=row[0],
        queue=message.queue,
        task=message.task,
        enqueued_at=row[1],
        available_at=row[2],
        deduplicated=row[3],
    )


def _write_controlled(message: PreparedMessage, using: str | None) -> EnqueuedMessage:
    """Enqueue with ``unique_for`` or ``debounce`` (``_enqueue_control.py``), its statements
    in one transaction."""
    alias = using or get_settings().DATABASE_ALIAS
    with transaction.atomic(using=alias, savepoint=False), connections[alias].cursor() as cursor:
        if message.debounce is not None:
            holder, pushed = _enqueue_control.debounce(cursor, message)
            return _enqueued(message.queue, holder, deduplicated=pushed)
        found = _enqueue_control.take_window(cursor, message)
        if found is not None:
            return _enqueued(message.queue, found, deduplicated=True)
        written = write_message(replace(message, unique_for=None), alias)
        holder = _enqueue_control.Holder(
            written.id, written.task, written.enqueued_at, written.available_at
        )
        _enqueue_control.record_window_holder(cursor, message, holder)
        return written


def _enqueued(
    queue: str, holder: _enqueue_control.Holder, *, deduplicated: bool
) -> EnqueuedMessage:
    return EnqueuedMessage(
        id=holder.id,
        queue=queue,
        task=holder.task,
        enqueued_at=holder.enqueued_at,
        available_at=holder.available_at,
        deduplicated=deduplicated,
    )


# The INSERT by (fair queue, dedup key).
_ENQUEUE_STATEMENTS = {
    (False, False): _sql.ENQUEUE,
    (False, True): _sql.ENQUEUE_DEDUP,
    (True, False): _sql.ENQUEUE_FAIR,
    (True, True): _sql.ENQUEUE_FAIR_DEDUP,
}


def _insert(
    connection: Any, statement: str, params: dict[str, Any], dedup: bool
) -> tuple[Any, ...] | None:
    """Insert through Django's cursor: ``(id, enqueued_at, available_at, deduplicated)``,
    the live holder of the dedup key when there is one, or ``None`` when it just finished."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        rows = cursor.fetchall()
        if rows:
            return (*rows[0][:3], False)
        if not dedup:
            raise RuntimeError("enqueue: the INSERT returned no row")  # cannot happen
        cursor.execute(_sql.FIND_BY_DEDUP_KEY, params)
        found = cursor.fetchone()
    return None if found is None else (*found, True)


def enqueue(
    task: str, payload: Any = None, *, using: str | None = None, **options: Unpack[MessageOptions]
) -> EnqueuedMessage:
    """Write one message in the caller's transaction (autocommit when there is none).

    A rollback leaves no message and sends no notification. ``run_after`` is an aware
    datetime or a timedelta added to database time, either way from
    ``_validation.RUN_AFTER_EARLIEST`` to ``RUN_AFTER_LATEST``. With ``dedup_key``, a live message of the
    same queue and key is returned instead (``deduplicated=True``); with ``unique_for`` too,
    the key's first message for that long, live or not; with ``debounce``, the key's message
    that has not started, its payload replaced and its start pushed back. Raises
    :class:`~django_pgqueue.exceptions.InvalidMessage` before writing anything on bad input.
    ``options``: :class:`MessageOptions`.
    """
    if tracing.active() is None:
        return write_message(prepare_message(task, payload, **options), using)
    with tracing.sending(str(options.get("queue") or ""), str(task)) as span:
        # Prepared inside the span: the headers carry its context.
        prepared = prepare_message(task, payload, **options)
        span.update_name(f"send {prepared.queue}")
        span.set_attribute("messaging.destination.name", prepared.queue)
        written = write_message(prepared, using)
        tracing.sent(span, written.id)
    return written


def enqueue_on_commit(
    task: str, payload: Any = None, *, using: str | None = None, **options: Unpack[MessageOptions]
) -> None:
    """Enqueue once the surrounding transaction commits (at once when there is none).

    Input is validated now, so a bad call raises here, in the view, not after the commit.
    Prefer :func:`enqueue` when the queue lives in the same database as your data: it is
    atomic with it. Use this when it must not be (e.g. the work reads the committed data
    through another connection). ``options``: :class:`MessageOptions`.
    """
    prepared = prepare_message(task, payload, **options)
    alias = using or get_settings().DATABASE_ALIAS
    transaction.on_commit(lambda: write_message(prepared, alias), using=alias)


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
    headers: dict[str, str] | None = None,
) -> int:
    """Bulk-enqueue one message per payload in one transaction; returns how many were written.

    The rows go in by ``COPY``. With dedup keys, a row whose key a live message of the queue
    holds, or an earlier row of the call, is skipped and not counted (as ``enqueue`` returns
    the holder). Every payload and key is validated before anything is written: a bad one
    raises :class:`~django_pgqueue.exceptions.InvalidMessage` naming its position. One
    wake-up is sent. ``headers``: one dict for every message.
    """
    # The arguments shared by every row are validated once; only payloads (and keys) vary.
    template = prepare_message(
        task,
        None,
        queue=queue,
        priority=priority,
        run_after=run_after,
        dedup_key=None,
        max_attempts=max_attempts,
        tenant=tenant,
        headers=headers,
    )
    max_bytes = get_settings().MAX_PAYLOAD_BYTES
    encoded: list[str] = []
    try:
        for payload in payloads:
            encoded.append(encode_payload(payload, max_bytes))
    except InvalidMessage as exc:
        raise type(exc)(f"payload {len(encoded)}: {exc}") from exc
    keys: list[str | None] | None = None
    if dedup_keys is not None:
        keys = []
        try:
            for key in dedup_keys:
                keys.append(validate_optional_key(key, "dedup_key", DEDUP_KEY_MAX_LENGTH))
        except InvalidMessage as exc:
            raise type(exc)(f"dedup key {len(keys)}: {exc}") from exc
        if len(keys) != len(encoded):
            raise ValueError("enqueue_many(): one dedup key per payload")
        if all(key is None for key in keys):
            keys = None
    return _write_many(template, encoded, keys, using=using)


def _write_many(
    template: PreparedMessage,
    payloads_json: list[str],
    dedup_keys: list[str | None] | None,
    *,
    using: str | None = None,
) -> int:
    """Write validated rows that share everything but payload and dedup key (``_bulk.py``).

    A key an earlier row of the call repeats is left out first. The rows go in by ``COPY``
    without asking which keys are held (the common case: none is). A held key makes the
    ``COPY`` fail on the unique index; the transaction (a savepoint inside the caller's) is
    rolled back, the rows whose key is held are left out (``_held_left_out``) and the rest
    go in by ``COPY``. A key a concurrent enqueue takes after that look fails it again: the
    rows then go in by one ``INSERT ... ON CONFLICT DO NOTHING``, which skips it and sends
    the wake-up only when it wrote a row.
    """
    if not payloads_json:
        return 0
    if dedup_keys is not None:
        payloads_json, dedup_keys = _rows_without(payloads_json, dedup_keys, set())
    alias = using or get_settings().DATABASE_ALIAS
    connection = connections[alias]
    for look_up in (False, True):
        try:
            with transaction.atomic(using=alias), connection.cursor() as cursor:
                if look_up and dedup_keys is not None:
                    payloads_json, dedup_keys = _held_left_out(
                        cursor, template.queue, payloads_json, dedup_keys
                    )
                    if not payloads_json:
                        return 0
                rows = _bulk_rows(cursor, template, payloads_json, dedup_keys, wake=True)
                with connection.wrap_database_errors:  # psycopg's errors as Django's
                    _bulk.copy_rows(cursor.cursor, rows)
                if rows.fair_order is None:  # else its wake-up went with the places
                    notify_queues([template.queue], later=template.later, using=alias)
            return len(payloads_json)
        except IntegrityError as exc:
            # Only dedup keys are unique: anything else is a bug to be seen.
            if dedup_keys is None or not isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                raise
    conf = get_settings()
    wake = (conf.NOTIFY_CHANNEL, wake_payload(template.queue, later=template.later))
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        rows = _bulk_rows(cursor, template, payloads_json, dedup_keys, wake=False)
        with connection.wrap_database_errors:
            return _bulk.insert_rows(cursor.cursor, rows, wake if conf.NOTIFY else None)


def _held_left_out(
    cursor: Any, queue: str, payloads_json: list[str], dedup_keys: list[str | None]
) -> tuple[list[str], list[str | None]]:
    """The rows whose key no live message of ``queue`` holds (their keys are distinct)."""
    wanted = _json.dumps([key for key in dedup_keys if key is not None])
    cursor.execute(_sql.HELD_DEDUP_KEYS, [wanted, queue])
    return _rows_without(payloads_json, dedup_keys, {key for (key,) in cursor.fetchall()})


def _rows_without(
    payloads_json: list[str], dedup_keys: list[str | None], left_out: set[str]
) -> tuple[list[str], list[str | None]]:
    """The rows whose key is not in ``left_out`` nor repeats an earlier row's (rows without
    a key are all kept)."""
    keyed = [key for key in dedup_keys if key is not None]
    if not left_out and len(set(keyed)) == len(keyed):
        return payloads_json, dedup_keys
    seen = set(left_out)
    payloads: list[str] = []
    keys: list[str | None] = []
    for payload, key in zip(payloads_json, dedup_keys, strict=True):
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        payloads.append(payload)
        keys.append(key)
    return payloads, keys


def _bulk_rows(
    cursor: Any,
    template: PreparedMessage,
    payloads_json: list[str],
    dedup_keys: list[str | None] | None,
    *,
    wake: bool,
) -> _bulk.BulkRows:
    """The rows of ``template`` with these payloads and keys, and when they become
    available; in a fair queue each row's place in the fair order (``FAIR_ORDER_OF_BULK``,
    which sends the wake-up too when ``wake``: for a COPY, which writes every row or fails
    and rolls the wake-up back with it): the first row's place, the others a step behind
    each other, -1 for all when they are scheduled."""
    available_at: str
    places: float | list[float] | None = None
    flow = flow_config(template.queue)
    if flow is not None and flow.keyed:
        step = flow.fair_step(template.tenant)
        conf = get_settings()
        cursor.execute(
            _sql.FAIR_ORDER_OF_BULK,
            {
                "queue": template.queue,
                "priority": template.priority,
                "tenant": template.tenant,
                "step": step,
                "run_at": template.run_at,
                "delay": template.delay or 0.0,
                "channel": conf.NOTIFY_CHANNEL if conf.NOTIFY and wake else None,
                "wake": wake_payload(template.queue, later=template.later),
            },
        )
        when, first, _ = cursor.fetchone()
        available_at = when.isoformat()
        places = -1.0 if first < 0 else [first + n * step for n in range(len(payloads_json))]
    elif template.run_at is not None:
        available_at = template.run_at.isoformat()
    elif not template.delay:
        # PostgreSQL reads ``now`` as the transaction's start, the column's default: no
        # round trip to ask for it.
        available_at = "now"
    else:
        cursor.execute(_sql.AVAILABLE_AFTER, [template.delay])
        available_at = cursor.fetchone()[0].isoformat()
    return _bulk.BulkRows(
        queue=template.queue,
        task=template.task,
        max_attempts=template.max_attempts,
        available_at=available_at,
        headers_json=template.headers_json,
        payloads=payloads_json,
        priority=template.priority,
        tenant=template.tenant,
        dedup_keys=dedup_keys,
        fair_order=places,
    )
