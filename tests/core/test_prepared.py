"""The driver path's pipeline (_prepared.run_on_driver with ``first``): two statements, one
round trip, one transaction, each statement with the snapshot of its own start."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import DataError, connection

from django_pgqueue.core import _prepared
from tests.conftest import connection_kwargs

pytestmark = pytest.mark.django_db(transaction=True)

LOCK_KEY = 0x70677199
LOCK = ("t_lock", "SELECT pg_advisory_xact_lock(%s)", ("int",), [LOCK_KEY])
OUR_LOCKS = (
    "SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
)


def run(statement: str, first: _prepared.DriverStatement | None = LOCK) -> list[tuple[Any, ...]]:
    assert _prepared.driver_path(connection)
    rows = _prepared.run_on_driver(
        connection, kind="t", statement=statement, types=(), params=[], typed_rows=True, first=first
    )
    assert rows is not None
    return rows


def test_both_statements_run_in_one_transaction_that_ends_with_the_round_trip():
    assert run(OUR_LOCKS) == [(1,)]  # the first statement's lock is held by the second
    assert run(OUR_LOCKS, first=None) == [(0,)]  # and was released at the Sync
    assert run("SELECT 1", first=None) == [(1,)]  # the session carries on, out of pipeline mode


@pytest.fixture
def rows_in(admin_conn: psycopg.Connection[Any]) -> Iterator[Callable[[], int]]:
    """A scratch table ``t_pipeline (n int)``; the fixture's value counts its rows."""
    admin_conn.execute("CREATE TABLE t_pipeline (n int)")
    yield lambda: admin_conn.execute("SELECT count(*)::int FROM t_pipeline").fetchone()[0]
    admin_conn.execute("DROP TABLE t_pipeline")


def test_the_second_statement_sees_what_was_committed_while_the_first_waited(rows_in):
    """What flow control relies on: the claim after the lock sees everything committed
    before the lock was granted (READ COMMITTED, a snapshot per statement)."""
    with psycopg.connect(**connection_kwargs()) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])
        holder.execute("INSERT INTO t_pipeline VALUES (1)")

        def commit_later() -> None:
            time.sleep(0.3)
            holder.commit()  # commits the row, then releases the lock

        committer = threading.Thread(target=commit_later)
        committer.start()
        assert run("SELECT count(*)::int FROM t_pipeline") == [(1,)]
        committer.join()


def test_an_error_in_the_first_statement_skips_the_second_and_is_raised(rows_in):
    broken = ("t_broken", "SELECT 1 / %s", ("int",), [0])
    with pytest.raises(DataError):
        run("INSERT INTO t_pipeline VALUES (1) RETURNING n", first=broken)
    assert rows_in() == 0
    # The session is usable again, in and out of a pipeline.
    assert run("INSERT INTO t_pipeline VALUES (2) RETURNING n") == [(2,)]
    assert rows_in() == 1


def test_an_error_in_the_second_statement_rolls_the_first_back(rows_in):
    insert = ("t_insert", "INSERT INTO t_pipeline VALUES (%s)", ("int",), [1])
    with pytest.raises(DataError):
        run("SELECT 1 / 0", first=insert)
    assert rows_in() == 0


def test_a_vanished_statement_answers_none_and_the_session_goes_the_plain_way(caplog):
    assert run("SELECT 1") == [(1,)]
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with caplog.at_level("WARNING", logger="django_pgqueue"):
        rows = _prepared.run_on_driver(
            connection, kind="t", statement="SELECT 1", types=(), params=[], first=LOCK
        )
    try:
        assert rows is None and "prepared statement vanished" in caplog.text
        assert not _prepared.driver_path(connection)
    finally:
        connection.close()  # the next test gets a session that keeps its statements
