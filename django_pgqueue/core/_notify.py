"""Wake-ups: NOTIFY is only a hint ("go look at queue X"); polling is the safety net.

One channel (``PGQUEUE['NOTIFY_CHANNEL']``). The payload is the queue name when messages are
ready now, and the queue name with :data:`LATER` when they fall due later (``run_after``): a
worker then looks up when, instead of claiming, and no worker has to look after every claim
(that lookup walks the index entries of recently leased messages, which a long-running
transaction elsewhere keeps from being cleaned up). Never a message body. Postgres merges
identical notifications of one transaction, so a transaction that enqueues 10,000 messages
on one queue sends one (two when some are ready and some later). ``cancel()`` tells the
workers holding a message it flagged with :func:`cancel_payload`: a hint too, the worker
reads the flags from the table.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connections
from psycopg import sql as pgsql

from ..conf import get_settings
from . import _sql

#: What follows the queue name in the payload of messages that fall due later.
LATER = ":later"
#: Starts the payload that tells a worker (its id follows) that ``cancel()`` flagged one of
#: its messages; no queue name can start so.
CANCEL_PREFIX = "~cancel "


def wake_payload(queue: str, *, later: bool = False) -> str:
    """The notification payload for messages of ``queue``, ready now or falling due later."""
    return f"{queue}{LATER}" if later else queue


def read_wake_payload(payload: str) -> tuple[str, bool]:
    """``(queue, later)`` from a payload (the queue is still to be validated)."""
    if payload.endswith(LATER):
        return payload[: -len(LATER)], True
    return payload, False


def notify_queues(queues: Iterable[str], *, later: bool = False, using: str | None = None) -> None:
    """Send one wake-up per distinct queue (delivered when the current transaction commits);
    ``later``: the messages fall due later, not now."""
    conf = get_settings()
    distinct = sorted({wake_payload(queue, later=later) for queue in queues})
    if not conf.NOTIFY or not distinct:
        return
    with connections[using or conf.DATABASE_ALIAS].cursor() as cursor:
        cursor.execute(_sql.NOTIFY_QUEUES, [conf.NOTIFY_CHANNEL, distinct])


def listen_statement(channel: str | None = None) -> pgsql.Composed:
    """``LISTEN "<channel>"`` with the channel quoted as an identifier."""
    return pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel or get_settings().NOTIFY_CHANNEL))


def cancel_payload(worker_id: str) -> str:
    """The notification that tells worker ``worker_id`` to read its messages' cancel flags."""
    return f"{CANCEL_PREFIX}{worker_id}"


def notify_cancel(worker_ids: Iterable[str], *, using: str | None = None) -> None:
    """Tell each worker that ``cancel()`` flagged one of its messages (at commit)."""
    conf = get_settings()
    payloads = sorted({cancel_payload(worker_id) for worker_id in worker_ids})
    if not conf.NOTIFY or not payloads:
        return
    with connections[using or conf.DATABASE_ALIAS].cursor() as cursor:
        cursor.execute(_sql.NOTIFY_QUEUES, [conf.NOTIFY_CHANNEL, payloads])
