"""Sending a hot statement (a claim, an ack, ``enqueue()``): prepared by psycopg, one round trip.

Planning a claim costs more than running it, and Django's cursor wrapper costs more than a
small INSERT, so in autocommit a hot statement goes straight to the driver connection under
Django's, through psycopg's own prepared statements (``execute(prepare=True)``): prepared
once per session, then one Bind/Execute. Django turns psycopg's statement cache off
(``prepare_threshold=None``, for poolers), which switches ``prepare=True`` off too; on the
connections used here the threshold is set out of reach instead, so psycopg prepares exactly
the statements sent with ``prepare=True`` and never one of Django's. Each goes without its
comments and indentation (:func:`as_sent`), short enough for psycopg to keep its parse.

A statement that needs plan settings of its own (``plan``) goes in a pipeline after a
``set_config(..., true)`` of each: both statements before one Sync, so they form one
implicit transaction, one round trip, and the settings end with it.

Not here (the caller sends the statement through Django's cursor, planned each time): inside
a transaction, where a vanished statement would abort the caller's work; while something
observes Django's cursors (``execute_wrappers``, the ``DEBUG`` query log); and on a session
that lost a prepared statement (a pooler in transaction mode, ``DISCARD ALL``), which goes
that way from then on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Mapping, Sequence
from datetime import UTC, tzinfo
from typing import Any

import psycopg
from django.db.backends.postgresql.psycopg_any import register_tzloader
from psycopg.types.datetime import TimestamptzLoader

logger = logging.getLogger("django_pgqueue")

#: ``prepare_threshold`` on the driver connections: only ``prepare=True`` prepares.
_ONLY_WHEN_ASKED = 2**62
#: Whether the libpq under psycopg has pipeline mode (14+), which ``plan`` needs.
_PIPELINE = psycopg.capabilities.has_pipeline()

# Driver connections that lost a prepared statement: they go the plain way from then on.
_unpreparable: weakref.WeakSet[Any] = weakref.WeakSet()
# One cursor per driver connection, kept: its adapters' caches make each call cheaper. With
# the time zone (Django's ``connection.timezone``) it loads timestamps in.
_cursors: weakref.WeakKeyDictionary[Any, tuple[psycopg.Cursor[Any], tzinfo | None]] = (
    weakref.WeakKeyDictionary()
)


def direct(connection: Any) -> bool:
    """Whether a hot statement may skip Django's cursor for :func:`run`: in autocommit, when
    nothing observes Django's cursors, on a session that kept its prepared statements."""
    if connection.execute_wrappers or connection.queries_logged:
        return False
    connection.close_if_health_check_failed()
    # ensure_connection() looks for a running event loop (async code must not block on the
    # database) by catching get_running_loop()'s error: a costly raise, on every call.
    if connection.connection is None or asyncio._get_running_loop() is not None:
        connection.ensure_connection()
    return (
        # get_autocommit() without its second ensure_connection()
        connection.autocommit
        and not connection.in_atomic_block
        and connection.connection not in _unpreparable
    )


def run(
    connection: Any,
    statement: str,
    params: Sequence[Any] | Mapping[str, Any],
    *,
    plan: Mapping[str, str] | None = None,
) -> list[tuple[Any, ...]] | None:
    """``statement`` as a prepared statement on the driver connection (check :func:`direct`
    first), under ``plan`` settings local to it: its rows, loaded as through Django's cursor;
    or ``None`` when it was not sent (the session lost the statement, or with ``plan`` a
    libpq without pipeline mode: nothing ran, the caller sends it through Django's cursor).
    Database errors come out as Django's exceptions."""
    if plan and not _PIPELINE:
        return None  # a libpq before 14: the caller's way, with its ``SET LOCAL``
    connection.validate_thread_sharing()
    if connection.connection is None:  # else :func:`direct` just ensured it, async check too
        connection.ensure_connection()
    raw = connection.connection
    kept = _cursors.get(raw)
    cursor = kept[0] if kept is not None and kept[1] == connection.timezone else _cursor(connection)
    with connection.wrap_database_errors:
        try:
            if plan:
                with raw.pipeline():
                    cursor.execute(_set_config(tuple(plan.items())), prepare=True)
                    cursor.execute(as_sent(statement), params, prepare=True)
            else:
                cursor.execute(as_sent(statement), params, prepare=True)
        except psycopg.errors.InvalidSqlStatementName:
            _unpreparable.add(raw)
            logger.warning(
                "Statements on this connection are planned every time: a prepared statement "
                "vanished (a pooler in transaction mode?)."
            )
            return None
        # Not ``cursor.description``: it builds a column object per column, on every call.
        result = cursor.pgresult
        if result is None or result.status != psycopg.pq.ExecStatus.TUPLES_OK:
            return []
        return cursor.fetchall()


@functools.cache
def as_sent(statement: str) -> str:
    """``statement`` without its comments and indentation, which are there for the reader of
    the source: psycopg keeps its parse of a query of up to 4 KiB and parses a longer one
    again on every call, and the claims are longer with their comments. String literals are
    kept as they are, even across lines."""
    lines = []
    quoted = False  # inside a string literal
    for line in statement.splitlines():
        text = line if quoted else line.lstrip()
        for at, char in enumerate(text):
            if char == "'":
                quoted = not quoted  # a doubled quote inside a literal toggles twice
            elif not quoted and text.startswith("--", at):
                text = text[:at].rstrip()
                break
        if text or quoted:
            lines.append(text)
    return "\n".join(lines)


def _cursor(connection: Any) -> psycopg.Cursor[Any]:
    """A cursor of our own on the driver connection, kept for it (``_cursors``)."""
    raw = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = _ONLY_WHEN_ASKED
    cursor = psycopg.Cursor(raw)
    if connection.timezone == UTC:  # USE_TZ = True: the session's time zone is UTC too
        # Django loads each timestamptz by parsing it in Python, then stamps its time zone on
        # it: in UTC, psycopg's own (compiled) loader gives the same datetimes, at a fraction
        # of the cost (a tenth of what enqueue() costs the client).
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
    else:  # as Django's cursors: its loader, for the time zone now in force
        register_tzloader(connection.timezone, cursor)
    _cursors[raw] = (cursor, connection.timezone)
    return cursor


_SET_CONFIG: dict[tuple[tuple[str, str], ...], str] = {}


def _set_config(settings: tuple[tuple[str, str], ...]) -> str:
    """One ``SELECT set_config(name, value, true), ...`` per set of settings (the same text
    each time, so that it stays prepared)."""
    text = _SET_CONFIG.get(settings)
    if text is None:
        text = _SET_CONFIG[settings] = "SELECT " + ", ".join(
            f"set_config('{name}', '{value}', true)" for name, value in settings
        )
    return text
