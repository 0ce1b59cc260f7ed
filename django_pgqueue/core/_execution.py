"""Running a hot-path statement with transaction-local settings in one round trip."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import get_settings

# Hot statements are planned once per session (a generic plan). One planned while the queue
# was empty (a worker starting on an idle queue) saw a table of a few rows, where a
# sequential scan is cheapest: it then found each claimed row by scanning the whole table,
# O(backlog) per row, until autovacuum happened to invalidate the plan. By id, always
# through an index.
NO_SEQSCAN = {"enable_seqscan": "off"}

# The claim must walk the claim index in order and stop after N rows. When the table's
# statistics are stale (a bulk load that autovacuum has not analyzed yet), the planner may
# estimate a handful of rows and pick a bitmap scan + sort of the whole backlog instead.
# Ruling those out for the claim keeps it O(batch) at any backlog.
# ``jit = off`` because ruling out a sort is done by pricing it at 10^10, which would also
# cross ``jit_above_cost`` and spend most of a second compiling a millisecond's query.
ORDERED_PLAN = {"enable_bitmapscan": "off", "enable_sort": "off", "jit": "off", **NO_SEQSCAN}

# Acks find a batch of leases by id. With stale statistics (or a small table) the planner
# may hash-join the batch against a sequential scan of the whole live table, O(backlog) for
# every ack; allowing only nested loops over the primary key keeps each ack O(batch).
BY_ID_PLAN = {"enable_hashjoin": "off", "enable_mergejoin": "off", **NO_SEQSCAN}

# Leases and acks may be lost in a database crash without breaking at-least-once delivery
# (the message runs again once its lease expires), so they need not wait for the WAL flush.
ASYNC_COMMIT = {"synchronous_commit": "off"}


def async_commit() -> dict[str, str]:
    """``ASYNC_COMMIT`` unless ``SYNCHRONOUS_ACKS``: for a transaction of our own only."""
    return {} if get_settings().SYNCHRONOUS_ACKS else ASYNC_COMMIT


def ack_settings(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """:func:`async_commit` when the ack runs in its own transaction.

    Never inside the caller's transaction: it would make *their* commit asynchronous too.
    """
    return {} if connection.in_atomic_block else async_commit()


# What every claim runs under (see ``_claim._run_claim``).
CLAIM_PLAN = {"plan_cache_mode": "force_generic_plan", **ORDERED_PLAN}

# A worker's claims: each lease gives its attempt back if it expires before a handler started
# alone (see "The attempt rule" in _sql.py). Only a worker, which runs redelivered messages
# alone (worker/executor.py), may promise that; other claims count every attempt.
REFUND_ON_EXPIRY = {"pgqueue.refund_on_expiry": "on"}

# How every batch transition by id (an ack, a failure, an extension) is planned: once per
# session, by id (``BY_ID_PLAN``).
ACK_PLAN = {"plan_cache_mode": "force_generic_plan", **BY_ID_PLAN}

# Driver connections that run nothing but a worker's own statements, and the settings their
# whole session runs under.
_dedicated: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


def dedicate_to_claims(connection: BaseDatabaseWrapper, *, refund_on_expiry: bool = False) -> None:
    """Put this thread's connection under the claim's settings for its whole session, so a
    claim on it is the prepared claim alone (``_send.run``), with no settings sent per claim.
    Only for a connection that runs nothing but a worker's own statements (its claim loop,
    its LISTEN): the settings would reach anything else run on it.
    ``refund_on_expiry``: its leases give their attempt back if they expire
    (:data:`REFUND_ON_EXPIRY`; the worker's claims). Idempotent and cheap; a new session
    (after a reconnect) is set up again.
    """
    refund = REFUND_ON_EXPIRY if refund_on_expiry else {}
    _dedicate(connection, {**CLAIM_PLAN, **async_commit(), **refund})


def dedicate_to_acks(connection: BaseDatabaseWrapper) -> None:
    """:func:`dedicate_to_claims` for a worker's completer: its session runs under the
    transitions' settings (``ACK_PLAN`` and the async commit), so an ack is the prepared
    statement alone."""
    _dedicate(connection, {**ACK_PLAN, **async_commit()})


def _dedicate(connection: BaseDatabaseWrapper, session: dict[str, str]) -> None:
    connection.ensure_connection()
    raw = connection.connection
    if _dedicated.get(raw) == session:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT " + ", ".join("set_config(%s, %s, false)" for _ in session),
            [value for item in session.items() for value in item],
        )
    _dedicated[raw] = session


def beyond_session(connection: BaseDatabaseWrapper, wanted: Mapping[str, str]) -> dict[str, str]:
    """The settings of ``wanted`` this connection's session does not run under already."""
    session = _dedicated.get(connection.connection) if connection.connection else None
    if not session:
        return dict(wanted)
    return {name: value for name, value in wanted.items() if session.get(name) != value}


def end_dedicated_session(connection: BaseDatabaseWrapper) -> None:
    """Close a connection dedicated to a worker's statements, so that whatever runs next on
    this thread gets a connection with Django's settings, not the worker's."""
    if connection.connection in _dedicated and not connection.in_atomic_block:
        connection.close()


def set_local(local_settings: Mapping[str, str]) -> str:
    """``SET LOCAL name = value;`` for each setting, as one string to put before a statement."""
    return "".join(f"SET LOCAL {name} = {value};\n" for name, value in local_settings.items())


def execute(
    cursor: Any,
    statement: str,
    params: Sequence[Any] | Mapping[str, Any],
    local_settings: Mapping[str, str],
) -> None:
    """``cursor.execute(statement, params)`` under ``SET LOCAL`` for each setting.

    Outside a transaction block the statements sent together form one implicit transaction,
    so ``SET LOCAL`` covers exactly this statement. One round trip with Django's default
    client-side binding (psycopg's ``ClientCursor`` accepts several statements); separate
    statements otherwise.
    """
    if not local_settings:
        cursor.execute(statement, params)
        return
    prefix = set_local(local_settings)
    if isinstance(cursor.cursor, psycopg.ClientCursor):
        cursor.execute(prefix + statement, params)
        for _ in local_settings:
            cursor.nextset()
    else:
        cursor.execute(prefix)
        cursor.execute(statement, params)
