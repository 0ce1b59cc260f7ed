"""The driver path's pipeline (prepared.run_on_driver with ``first``): two statements, one
round trip, one transaction, each statement with the snapshot of its own start."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import DataError, connection

from django_pgqueue.core import prepared
from tests.conftest import connection_kwargs

pytestmark = pytest.mark.django_db(transaction=True)

LOCK_KEY = 0x70677199
LOCK = ("t_lock", "SELECT pg_advisory_xact_lock(%s)", ("int",), [LOCK_KEY])
OUR_LOCKS = (
    "SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
)


def run(statement: str, first: prepared.DriverStatement | None = LOCK) -> list[tuple[Any, ...]]:
    assert prepared.driver_path(connection)
    rows = prepared.run_on_driver(
        connection, kind="t", statement=statement, types=(), params=[], typed_rows=True, first=first
    )
    assert rows is not None
    return rows


def test_both_statements_run_in_one_transaction_that_ends_with_the_round_trip():
    assert run(OUR_LOCKS) == [(1,)]  # the first statement's lock is held by the second
    assert run(OUR_LOCKS, first=None) == [(0,)]  # and was released at the Sync
    assert run("SELECT 1", first=None) == [(1,)]  # the session carries on, out of pipeline mode


def test_the_second_statement_sees_what_was_committed_while_the_first_waited(admin_conn):
    """What flow control relies on: the claim after the lock sees everything committed
    before the lock was granted (READ COMMITTED, a snapshot per statement)."""
    admin_conn.execute("CREATE TABLE t_pipeline_seen (n int)")
    holder = psycopg.connect(**connection_kwargs())
    try:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])
        holder.execute("INSERT INTO t_pipeline_seen VALUES (1)")

        def commit_later() -> None:
            time.sleep(0.3)
            holder.commit()  # commits the row, then releases the lock

        threading.Thread(target=commit_later).start()
        assert run("SELECT count(*)::int FROM t_pipeline_seen") == [(1,)]
    finally:
        holder.close()
        admin_conn.execute("DROP TABLE t_pipeline_seen")


def test_an_error_in_the_first_statement_skips_the_second_and_is_raised(admin_conn):
    admin_conn.execute("CREATE TABLE t_pipeline_skipped (n int)")
    try:
        broken = ("t_broken", "SELECT 1 / %s", ("int",), [0])
        with pytest.raises(DataError):
            run("INSERT INTO t_pipeline_skipped VALUES (1) RETURNING n", first=broken)
        assert admin_conn.execute("SELECT count(*) FROM t_pipeline_skipped").fetchone() == (0,)
        # The session is usable again, in and out of a pipeline.
        assert run("INSERT INTO t_pipeline_skipped VALUES (2) RETURNING n") == [(2,)]
        assert admin_conn.execute("SELECT count(*) FROM t_pipeline_skipped").fetchone() == (1,)
    finally:
        admin_conn.execute("DROP TABLE t_pipeline_skipped")


def test_an_error_in_the_second_statement_rolls_the_first_back(admin_conn):
    admin_conn.execute("CREATE TABLE t_pipeline_undone (n int)")
    try:
        insert = ("t_insert", "INSERT INTO t_pipeline_undone VALUES (%s)", ("int",), [1])
        with pytest.raises(DataError):
            run("SELECT 1 / 0", first=insert)
        assert admin_conn.execute("SELECT count(*) FROM t_pipeline_undone").fetchone() == (0,)
    finally:
        admin_conn.execute("DROP TABLE t_pipeline_undone")


def test_a_vanished_statement_answers_none_and_the_session_goes_the_plain_way(caplog):
    assert run("SELECT 1") == [(1,)]
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with caplog.at_level("WARNING", logger="django_pgqueue"):
        rows = prepared.run_on_driver(
            connection, kind="t", statement="SELECT 1", types=(), params=[], first=LOCK
        )
    try:
        assert rows is None and "prepared statement vanished" in caplog.text
        assert not prepared.driver_path(connection)
    finally:
        connection.close()  # the next test gets a session that keeps its statements
