"""The driver path (_prepared.run_on_driver): a session that loses its prepared statements
(a pooler in transaction mode) goes the plain way from then on."""

from __future__ import annotations

import pytest
from django.db import connection

from django_pgqueue.core import _prepared

pytestmark = pytest.mark.django_db(transaction=True)


def run(statement: str) -> list[tuple[object, ...]] | None:
    assert _prepared.driver_path(connection)
    return _prepared.run_on_driver(
        connection, kind="t", statement=statement, types=(), params=[], typed_rows=True
    )


def test_a_vanished_statement_answers_none_and_the_session_goes_the_plain_way(caplog):
    assert run("SELECT 1") == [(1,)]
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with caplog.at_level("WARNING", logger="django_pgqueue"):
        rows = run("SELECT 1")
    try:
        assert rows is None and "prepared statement vanished" in caplog.text
        assert not _prepared.driver_path(connection)
    finally:
        connection.close()  # the next test gets a session that keeps its statements
