"""Wake-ups: NOTIFY is only a hint ("go look at queue X"); polling is the safety net.

One channel (``PGQUEUE['NOTIFY_CHANNEL']``), payload = the queue name, never a message body.
Postgres merges identical notifications of one transaction, so a transaction that enqueues
10,000 messages on one queue sends one.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connections
from psycopg import sql as pgsql

from ..conf import get_settings
from . import _sql


def notify_queues(queues: Iterable[str], *, using: str | None = None) -> None:
    """Send one wake-up per distinct queue (delivered when the current transaction commits)."""
    conf = get_settings()
    distinct = sorted(set(queues))
    if not conf.NOTIFY or not distinct:
        return
    with connections[using or conf.DATABASE_ALIAS].cursor() as cursor:
        cursor.execute(_sql.NOTIFY_QUEUES, [conf.NOTIFY_CHANNEL, distinct])


def listen_statement(channel: str | None = None) -> pgsql.Composed:
    """``LISTEN "<channel>"`` with the channel quoted as an identifier."""
    return pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel or get_settings().NOTIFY_CHANNEL))
