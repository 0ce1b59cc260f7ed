"""The direct path (core/_send.py): psycopg's own prepared statements, plan settings local to
the statement in one pipeline, and a session that loses its statements going the plain way."""

from __future__ import annotations

import pytest
from django.db import connection
from psycopg import _queries

from django_pgqueue.core import _claim_sql, _send
from tests.sessions import lose_prepared_statements

pytestmark = pytest.mark.django_db(transaction=True)

SETTING = "SELECT current_setting('enable_sort'), txid_current_if_assigned() IS NULL"


def test_a_statement_is_prepared_once_per_session():
    for _ in range(3):
        assert _send.run(connection, "SELECT %s::int + 1", [1]) == [(2,)]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement = 'SELECT $1::int + 1'"
        )
        assert cursor.fetchone()[0] == 1


def test_plan_settings_hold_for_the_statement_and_end_with_it():
    assert _send.run(connection, SETTING, [], plan={"enable_sort": "off"}) == [("off", True)]
    assert _send.run(connection, SETTING, []) == [("on", True)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('enable_sort')")
        assert cursor.fetchone() == ("on",)


def test_the_settings_and_the_statement_are_one_transaction():
    rows = _send.run(
        connection,
        "SELECT txid_current() = (SELECT backend_xid::text::bigint FROM pg_stat_activity "
        "WHERE pid = pg_backend_pid()), now() = statement_timestamp()",
        [],
        plan={"enable_sort": "off"},
    )
    # now() is the transaction's start, which the settings' statement began.
    assert rows == [(True, False)]


def test_a_vanished_statement_answers_none_and_the_session_goes_the_plain_way(caplog):
    assert _send.run(connection, "SELECT 1", []) == [(1,)]
    lose_prepared_statements(connection)
    with caplog.at_level("WARNING", logger="django_pgqueue"):
        rows = _send.run(connection, "SELECT 1", [])
    try:
        assert rows is None and "prepared statement vanished" in caplog.text
        assert not _send.direct(connection)
    finally:
        connection.close()  # the next test gets a session that keeps its statements


def test_nothing_goes_direct_inside_a_transaction_or_while_queries_are_observed():
    from django.db import transaction
    from django.test.utils import CaptureQueriesContext

    assert _send.direct(connection)
    with transaction.atomic():
        assert not _send.direct(connection)
    with CaptureQueriesContext(connection):
        assert not _send.direct(connection)


@pytest.mark.django_db(transaction=True)
def test_without_pipeline_mode_statements_with_settings_go_through_djangos_cursor(
    monkeypatch, settings
):
    """A libpq before 14 has no pipeline mode: a claim, an ack and a fair enqueue, which need
    settings of their own, go the caller's way; everything still works."""
    import django_pgqueue
    from django_pgqueue.core import transitions
    from django_pgqueue.models import Message

    monkeypatch.setattr(_send, "_PIPELINE", False)
    assert _send.run(connection, "SELECT 1", [], plan={"jit": "off"}) is None
    assert _send.run(connection, "SELECT 1", []) == [(1,)]
    settings.PGQUEUE = {"QUEUES": {"fair": {"FAIRNESS": True}}}
    sent = [
        django_pgqueue.enqueue("t", {"n": n}, queue=q) for n, q in enumerate(["default", "fair"])
    ]
    leased = Message.objects.lease(["default", "fair"], worker_id="w", batch_size=5)
    assert sorted(m.id for m in leased) == sorted(m.id for m in sent)
    assert transitions.complete(leased).done == [m.id for m in leased]
    assert _send.direct(connection)  # nothing was lost on the way


def test_async_code_gets_djangos_error_on_an_open_connection_too(monkeypatch):
    """The direct path keeps ``ensure_connection()``'s guard: under a running event loop a
    statement raises ``SynchronousOnlyOperation`` instead of blocking the loop."""
    import asyncio

    from django.core.exceptions import SynchronousOnlyOperation
    from django.db import connections

    import django_pgqueue

    async def enqueue_twice() -> None:
        monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
        django_pgqueue.enqueue("t", {})  # opens this context's connection
        monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE")
        try:
            assert connections["default"].connection is not None
            with pytest.raises(SynchronousOnlyOperation):
                django_pgqueue.enqueue("t", {})
        finally:
            monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
            connections["default"].close()

    asyncio.run(enqueue_twice())


def test_the_kept_cursor_follows_a_time_zone_change(settings):
    """The direct path loads timestamps as Django's cursor would, on the same session before
    and after ``USE_TZ`` changes: aware in UTC, or naive in ``TIME_ZONE``."""
    import django_pgqueue
    from django_pgqueue.models import Message

    settings.TIME_ZONE = "America/New_York"
    for use_tz in (True, False, True):
        settings.USE_TZ = use_tz
        sent = django_pgqueue.enqueue("t", {})
        stored = Message.objects.get(pk=sent.id)
        assert (sent.enqueued_at, sent.available_at) == (stored.enqueued_at, stored.available_at)
        assert (sent.enqueued_at.tzinfo is None) is (not use_tz)


def test_a_statement_is_sent_without_its_comments_and_indentation_but_its_literals_whole():
    statement = """
    SELECT 'a -- b',  -- a comment
           'two
      lines', ''  -- another
    -- a line of comment
    FROM t
    """
    assert _send.as_sent(statement) == "SELECT 'a -- b',\n'two\n      lines', ''\nFROM t"
    rows = _send.run(connection, "SELECT 'x -- y' AS v -- gone\n  , 1", [])
    assert rows == [("x -- y", 1)]


@pytest.mark.parametrize("name", ["PLAIN_CLAIM", "BOUNDED_CLAIM", "FLOW_CLAIM"])
def test_each_claim_as_sent_is_short_enough_for_psycopg_to_keep_its_parse(name):
    assert len(_send.as_sent(getattr(_claim_sql, name)).encode()) <= (
        _queries.MAX_CACHED_STATEMENT_LENGTH
    )
