"""Prepared statements for the hot path, with a fallback for poolers.

Planning a claim costs more than running it, so each connection prepares a claim once
(``PREPARE name AS ...``) and then sends ``SET LOCAL ...; EXECUTE name(...)`` as one query
string: one round trip, run by the server as one implicit transaction. A session that cannot
keep prepared statements (PgBouncer in transaction mode, ``DISCARD ALL``) is remembered and
gets the plain statement from then on.

A single ``enqueue()`` in autocommit, and a worker's claim on a connection dedicated to
claims (:func:`dedicate_to_claims`), are cheaper still as a protocol-level prepared
statement sent on the driver connection itself: :func:`run_on_driver`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import weakref
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from django.db import ProgrammingError

logger = logging.getLogger("django_pgqueue")

# Prepared statement names per database connection (a new connection prepares again), and
# the connections that cannot keep prepared statements.
_prepared: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_unpreparable: weakref.WeakSet[Any] = weakref.WeakSet()


@functools.lru_cache(maxsize=1024)
def prepared_form(kind: str, statement: str, types: tuple[str, ...]) -> tuple[str, str]:
    """``(name, PREPARE ...)`` for a statement: its placeholders become ``$n``,
    ``%%`` becomes ``%``. Cached: the claim's statement is the same object every time."""
    name, body = _named_body(kind, statement, types)
    return name, f"PREPARE {name} ({', '.join(types)}) AS {body}"


_PLACEHOLDER = re.compile(r"%%|%s|%\((\w+)\)s")


@functools.lru_cache(maxsize=256)
def parameter_names(statement: str) -> tuple[str, ...]:
    """The ``%(name)s`` parameters of a statement, in the order of their numbers (``$1``...):
    pass the values in this order."""
    return tuple(dict.fromkeys(m.group(1) for m in _PLACEHOLDER.finditer(statement) if m.group(1)))


@functools.lru_cache(maxsize=1024)
def _named_body(kind: str, statement: str, types: tuple[str, ...]) -> tuple[str, str]:
    """The statement's name and its body with ``$n`` placeholders (``%s`` numbered in order,
    ``%(name)s`` by :func:`parameter_names`)."""
    position = iter(range(1, len(types) + 1))
    names = parameter_names(statement)

    def number(match: re.Match[str]) -> str:
        if match.group() == "%%":
            return "%"
        if match.group(1):
            return f"${names.index(match.group(1)) + 1}"
        return f"${next(position)}"

    body = _PLACEHOLDER.sub(number, statement)
    digest = hashlib.sha1(f"{types}|{body}".encode(), usedforsecurity=False).hexdigest()[:16]
    return f"pgq_{kind}_{digest}", body


def can_prepare(connection: Any, cursor: Any) -> bool:
    """In autocommit outside a transaction, with client-side binding (several statements in
    one string)."""
    return (
        connection.get_autocommit()
        and not connection.in_atomic_block
        and isinstance(cursor.cursor, psycopg.ClientCursor)
        and connection.connection not in _unpreparable
    )


def execute_all(
    cursor: Any,
    statements: str,
    params: Sequence[Any] | Mapping[str, Any],
    *,
    reuse_text: bool = False,
) -> None:
    """Run ``;``-separated statements in one round trip, leaving the cursor on the last
    one's result (client-side binding only).

    ``reuse_text``: the same statements with the same parameters run again and again (a
    worker's claim): bind them once per connection and send the cached text afterwards.
    """
    if reuse_text:
        cursor.execute(_bound_text(cursor, statements, params))
    else:
        cursor.execute(statements, params)
    for _ in range(statements.count(";")):
        cursor.nextset()


# Bound query texts per driver connection (quoting may depend on the session's settings).
_bound: weakref.WeakKeyDictionary[Any, dict[Any, str]] = weakref.WeakKeyDictionary()
_BOUND_MAX = 256


def _bound_text(cursor: Any, statements: str, params: Sequence[Any] | Mapping[str, Any]) -> str:
    """``statements`` bound to ``params`` by the cursor, cached per driver connection."""
    texts = _bound.setdefault(cursor.cursor.connection, {})
    key = (
        statements,
        tuple(params.items()) if isinstance(params, Mapping) else tuple(params),
    )
    text = texts.get(key)
    if text is None:
        if len(texts) >= _BOUND_MAX:
            texts.clear()
        text = texts[key] = cursor.cursor.mogrify(statements, params)
    return text


def execute_prepared(
    cursor: Any,
    connection: Any,
    *,
    kind: str,
    statement: str,
    types: tuple[str, ...],
    params: Sequence[Any],
    prefix: str = "",
    reuse_text: bool = False,
) -> list[Any] | None:
    """:func:`run_prepared` for a ``%s``-style ``statement`` with positional ``params`` of
    the given ``types``: its name and ``PREPARE`` come from :func:`prepared_form`."""
    name, prepare = prepared_form(kind, statement, types)
    return run_prepared(
        cursor,
        connection,
        name=name,
        prepare=prepare,
        prefix=prefix,
        arguments=", ".join(["%s"] * len(params)),
        params=params,
        reuse_text=reuse_text,
    )


def run_prepared(
    cursor: Any,
    connection: Any,
    *,
    name: str,
    prepare: str,
    prefix: str,
    arguments: str,
    params: Sequence[Any] | Mapping[str, Any],
    reuse_text: bool = False,
) -> list[Any] | None:
    """``prefix`` then ``EXECUTE name(arguments)``, preparing ``name`` first if needed
    (``reuse_text``: see :func:`execute_all`).

    Returns the rows, or ``None`` when the session lost its prepared statement: the whole
    query string was one implicit transaction, so nothing happened, and the caller sends the
    plain statement instead.
    """
    raw = connection.connection
    done = _prepared.setdefault(raw, set())
    try:
        if name not in done:
            try:
                cursor.execute(prepare)
            except ProgrammingError as exc:
                if not isinstance(exc.__cause__, psycopg.errors.DuplicatePreparedStatement):
                    raise
            done.add(name)
        execute_all(cursor, f"{prefix}EXECUTE {name}({arguments})", params, reuse_text=reuse_text)
        return list(cursor.fetchall())
    except ProgrammingError as exc:
        if not isinstance(exc.__cause__, psycopg.errors.InvalidSqlStatementName):
            raise
        _lost_prepared_statements(raw)
        return None


def _lost_prepared_statements(raw: Any) -> None:
    """Remember a session that lost a prepared statement: it goes the plain way from now on."""
    _unpreparable.add(raw)
    logger.warning(
        "Statements on this connection are planned every time: a prepared statement "
        "vanished (a pooler in transaction mode?)."
    )


def driver_path(connection: Any) -> bool:
    """Whether a hot statement may skip Django's cursor for :func:`run_on_driver`: in
    autocommit (a vanished statement would abort a transaction), when nothing observes
    Django's cursors (``execute_wrappers``, the ``DEBUG`` query log), on a connection that
    kept its prepared statements so far."""
    if connection.execute_wrappers or connection.queries_logged:
        return False
    connection.close_if_health_check_failed()
    return (
        connection.get_autocommit()
        and not connection.in_atomic_block
        and connection.connection not in _unpreparable
    )


def run_on_driver(
    connection: Any,
    *,
    kind: str,
    statement: str,
    types: tuple[str, ...],
    params: Sequence[Any],
    typed_rows: bool = False,
) -> list[tuple[Any, ...]] | None:
    """Run a ``%s``-style ``statement`` as a protocol-level prepared statement on the driver
    connection under Django's (check :func:`driver_path` first): one Bind/Execute round
    trip, parameters sent in text format. Rows come as the raw binary values, or with
    ``typed_rows`` loaded by the connection's own loaders, as through Django's cursor.

    Django's cursor wrapper and a client-side-bound ``EXECUTE`` cost more than a small
    INSERT itself. psycopg's own statement cache is off on Django's connections
    (``prepare_threshold=None``, kept for poolers), so the statement is prepared here, once
    per session, with the same fallback as :func:`run_prepared`: ``None`` when the session
    lost it (nothing ran), and the connection goes the plain way from then on. Database
    errors come out as Django's exceptions, as through its cursor.

    """
    connection.validate_thread_sharing()
    raw = connection.connection
    done = _prepared.setdefault(raw, set())
    result_format = psycopg.pq.Format.TEXT if typed_rows else psycopg.pq.Format.BINARY
    with connection.wrap_database_errors, raw.lock:
        pgconn = raw.pgconn
        name, body = _named_body(kind, statement, types)
        if name not in done:
            pgconn.send_prepare(name.encode(), body.encode(), [_OIDS[t] for t in types])
            _check(raw, raw.wait(psycopg.generators.execute(pgconn)), allow_duplicate=True)
            done.add(name)
        values = [None if p is None else _text(p) for p in params]
        pgconn.send_query_prepared(name.encode(), values, result_format=result_format)
        result = _check(raw, raw.wait(psycopg.generators.execute(pgconn)))
    if result is None:
        _lost_prepared_statements(raw)
        return None
    if typed_rows:
        loader = psycopg.adapt.Transformer(raw)
        loader.set_pgresult(result)
        return loader.load_rows(0, result.ntuples, tuple)
    columns = range(result.nfields)
    return [tuple(result.get_value(row, c) for c in columns) for row in range(result.ntuples)]


def run_script_on_driver(
    connection: Any,
    *,
    name: str,
    prepare: str,
    script: str,
    params: Sequence[Any] | Mapping[str, Any],
) -> list[tuple[Any, ...]] | None:
    """``script`` (``;``-separated statements ending in ``EXECUTE name(...)``) as one simple
    query on the driver connection, after ``prepare`` if this session has not run it: one
    round trip, one implicit transaction, the rows of the last statement loaded by the
    connection's own loaders. For a statement that needs ``SET LOCAL`` settings in its own
    transaction (a fair queue's enqueue): no Django cursor. Falls back as
    :func:`run_on_driver`: ``None`` when the session lost the statement.
    """
    connection.validate_thread_sharing()
    raw = connection.connection
    done = _prepared.setdefault(raw, set())
    text = psycopg.ClientCursor(raw).mogrify(script, params)
    with connection.wrap_database_errors, raw.lock:
        pgconn = raw.pgconn
        if name not in done:
            pgconn.send_query(prepare.encode())
            _check(raw, raw.wait(psycopg.generators.execute(pgconn)), allow_duplicate=True)
            done.add(name)
        pgconn.send_query(text.encode())
        result = _check(raw, raw.wait(psycopg.generators.execute(pgconn)))
    if result is None:
        _lost_prepared_statements(raw)
        return None
    loader = psycopg.adapt.Transformer(raw)
    loader.set_pgresult(result)
    return loader.load_rows(0, result.ntuples, tuple)


_OIDS = {
    "text": 25,
    "int": 23,
    "bigint": 20,
    "timestamptz": 1184,
    "float8": 701,
    "boolean": 16,
    "jsonb": 3802,
}


def _text(value: Any) -> bytes:
    """A parameter in Postgres text format (``float`` as ``repr``: exact; ``True`` and
    ``False`` are valid boolean input)."""
    if isinstance(value, datetime):
        return value.isoformat().encode()
    return str(value).encode()


def _check(raw: Any, results: list[Any], *, allow_duplicate: bool = False) -> Any:
    """The last result, ``None`` for a vanished prepared statement, or the error raised."""
    result = results[-1]
    if result.status in (psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK):
        return result
    error = psycopg.errors.error_from_result(result, encoding=raw.info.encoding)
    if isinstance(error, psycopg.errors.InvalidSqlStatementName):
        return None
    if allow_duplicate and isinstance(error, psycopg.errors.DuplicatePreparedStatement):
        return result
    raise error
