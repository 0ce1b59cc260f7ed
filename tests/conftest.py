"""Fixtures shared by the whole suite: real PostgreSQL connections for faults and NOTIFY."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import TransactionTestCase

from django_pgqueue.compat import TASKS_FRAMEWORK


def pytest_report_header() -> str:
    return f"tasks framework: {TASKS_FRAMEWORK or 'none (tests/tasks not collected)'}"


# After each transactional test Django flushes the database: one TRUNCATE of every table, a
# third of a second or more even when they are empty (a fresh file per table and index), most
# of the suite's time. Truncating only the tables written since the last flush leaves the
# database as that flush would: a table still at its size right after a flush has had nothing
# written to it (a row in an empty table takes a new page), and the only tables with rows
# after a flush, content types and permissions, are written by no test; if they change, the
# whole flush runs as Django's.
TABLE_SIZES = """
SELECT name, coalesce(
    (SELECT sum(pg_total_relation_size(part.relid)) FROM pg_partition_tree(rel) part),
    pg_total_relation_size(rel))
FROM unnest(%s::text[]) AS name, CAST(quote_ident(name) AS regclass) AS rel
"""
REFILLED_BY_FLUSH = {"django_content_type", "auth_permission"}
_sizes_after_flush: dict[str, dict[str, int]] = {}


def _table_sizes(alias: str) -> dict[str, int]:
    db = connections[alias]
    with db.cursor() as cursor:
        tables = db.introspection.django_table_names(only_existing=True, include_views=False)
        cursor.execute(TABLE_SIZES, [sorted(tables)])
        return {name: int(size) for name, size in cursor.fetchall()}


def _flush_what_was_written(test_case: TransactionTestCase) -> None:
    # Django's own flush walks the same databases: a mirror is the database it mirrors.
    aliases = test_case._databases_names(include_mirrors=False)  # type: ignore[attr-defined]
    for alias in aliases:
        sizes = _table_sizes(alias)
        after_flush = _sizes_after_flush.get(alias)
        written = [name for name, size in sizes.items() if (after_flush or {}).get(name) != size]
        if after_flush is None or REFILLED_BY_FLUSH & set(written):
            call_command(
                "flush",
                verbosity=0,
                interactive=False,
                database=alias,
                reset_sequences=False,
                allow_cascade=False,
                inhibit_post_migrate=False,
            )
        elif written:
            db = connections[alias]
            tables = ", ".join(db.ops.quote_name(name) for name in written)
            with transaction.atomic(using=alias), db.cursor() as cursor:
                cursor.execute(f"TRUNCATE {tables} CASCADE")
        _sizes_after_flush[alias] = _table_sizes(alias)


TransactionTestCase._fixture_teardown = _flush_what_was_written  # type: ignore[attr-defined]


def connection_kwargs() -> dict[str, Any]:
    """psycopg connect() arguments for the database the tests are using right now."""
    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    return params


@pytest.fixture
def admin_conn(transactional_db: None) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection of our own, beside Django's, for injecting faults."""
    with psycopg.connect(**connection_kwargs(), autocommit=True) as conn:
        yield conn


@pytest.fixture
def listener(transactional_db: None) -> Iterator[psycopg.Connection[Any]]:
    """A second connection LISTENing on the queue channel; read with ``drain(listener)``."""
    from django_pgqueue.core._notify import listen_statement

    with psycopg.connect(**connection_kwargs(), autocommit=True) as conn:
        conn.execute(listen_statement())
        yield conn


def drain(conn: psycopg.Connection[Any], timeout: float = 0.5) -> list[tuple[str, str]]:
    """All notifications that arrive within ``timeout`` seconds: (channel, payload) pairs."""
    return [(n.channel, n.payload) for n in conn.notifies(timeout=timeout)]
