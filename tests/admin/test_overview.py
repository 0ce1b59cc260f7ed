"""The dashboard numbers: exact below the cap, marked "N+" above it, bounded statements."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_pgqueue.admin.overview import CappedCount, known_queues, read_overview
from django_pgqueue.core import operations
from django_pgqueue.models import DeadReason
from tests.factories import (
    ArchivedMessageFactory,
    DeadMessageFactory,
    MessageFactory,
    QueueStateFactory,
    WorkerHeartbeatFactory,
)

pytestmark = pytest.mark.django_db

NOW = timezone.now


def _by_name(overview):  # type: ignore[no-untyped-def]
    return {q.name: q for q in overview.queues}


def failed_at(*ages: dt.timedelta) -> list[dict[str, object]]:
    """An ``errors`` history: one failed attempt this long ago per age, as workers write it."""
    return [
        {"attempt": n, "at": (NOW() - age).isoformat(), "type": "ValueError", "message": "no"}
        for n, age in enumerate(ages, start=1)
    ]


def test_counts_every_state_per_queue() -> None:
    past = NOW() - dt.timedelta(minutes=3)
    future = NOW() + dt.timedelta(hours=1)
    MessageFactory.create_batch(3, queue="emails", available_at=past)
    MessageFactory(queue="emails", priority=5, available_at=past - dt.timedelta(minutes=7))
    MessageFactory.create_batch(2, queue="emails", available_at=future)
    MessageFactory(queue="emails", attempts=1, available_at=future)  # backing off
    MessageFactory(queue="emails", attempts=1, available_at=past)  # backoff over, ready
    MessageFactory.create_batch(2, queue="emails", leased=True)
    # Leased on its last attempt: only in the exhausted index.
    MessageFactory(queue="emails", leased=True, attempts=3, max_attempts=3)
    DeadMessageFactory.create_batch(2, queue="emails", errors=failed_at(dt.timedelta(0)))
    DeadMessageFactory(
        queue="emails",
        died_at=NOW() - dt.timedelta(minutes=30),
        errors=failed_at(dt.timedelta(minutes=30)),
    )
    ArchivedMessageFactory.create_batch(4, queue="emails")
    ArchivedMessageFactory(queue="emails", finished_at=NOW() - dt.timedelta(minutes=20))
    ArchivedMessageFactory(queue="emails", finished_at=NOW() - dt.timedelta(hours=3))
    MessageFactory(queue="reports", available_at=past)

    overview = read_overview()
    emails = _by_name(overview)["emails"]

    assert str(emails.ready) == "5"
    assert str(emails.scheduled) == "3"
    assert str(emails.in_flight) == "3"
    assert str(emails.retrying) == "2"
    assert str(emails.dead) == "3"
    assert emails.processed_5m == CappedCount(4)
    assert emails.processed_60m == CappedCount(5)
    assert emails.failed_5m == CappedCount(2)
    assert emails.failed_60m == CappedCount(3)
    # The oldest ready message became available ten minutes ago (priority 5 one).
    assert emails.oldest_ready_age is not None
    assert dt.timedelta(minutes=9) < emails.oldest_ready_age < dt.timedelta(minutes=11)
    assert _by_name(overview)["reports"].ready == CappedCount(1)


def test_counts_stop_at_the_cap_and_say_so() -> None:
    MessageFactory.create_batch(7, queue="big", available_at=NOW() - dt.timedelta(seconds=5))
    MessageFactory.create_batch(6, queue="big", available_at=NOW() + dt.timedelta(hours=1))
    DeadMessageFactory.create_batch(6, queue="big", errors=failed_at(dt.timedelta(0)))

    big = _by_name(read_overview(cap=5, throughput_cap=5, failure_rows=5))["big"]

    assert big.ready == CappedCount(5, capped=True)
    assert str(big.ready) == "5+"
    assert big.scheduled.capped and big.scheduled.value == 5
    assert big.dead == CappedCount(5, capped=True)
    # Failed attempts read from 5 + 1 rows of errors: at least that many.
    assert big.failed_5m.capped and big.failed_5m.value >= 5
    assert str(big.failed_5m).endswith("+")


def test_queue_list_includes_state_rows_workers_and_dead_only_queues() -> None:
    QueueStateFactory(name="paused-one", paused=True)
    DeadMessageFactory(queue="only-dead")
    ArchivedMessageFactory(queue="only-archived")
    WorkerHeartbeatFactory(queues=["listening"])
    WorkerHeartbeatFactory(queues=["gone"], last_seen_at=NOW() - dt.timedelta(hours=1))

    queues = dict(known_queues())

    assert queues["paused-one"] is True
    assert {"only-dead", "only-archived", "listening"} <= set(queues)
    assert "gone" not in queues


def test_live_workers_are_those_with_recent_heartbeats() -> None:
    WorkerHeartbeatFactory(worker_id="alive:1", stats={"running": ["emails:send"]})
    WorkerHeartbeatFactory(worker_id="dead:2", last_seen_at=NOW() - dt.timedelta(hours=1))

    workers = read_overview().workers

    assert [w.worker_id for w in workers] == ["alive:1"]
    assert workers[0].stats == {"running": ["emails:send"]}


def test_statement_count_does_not_grow_with_queues_or_rows() -> None:
    MessageFactory(queue="q1")
    with CaptureQueriesContext(connection) as one_queue:
        read_overview()
    for n in range(2, 9):
        MessageFactory.create_batch(3, queue=f"q{n}")
        DeadMessageFactory(queue=f"q{n}", reason=DeadReason.TIMEOUT)
    with CaptureQueriesContext(connection) as eight_queues:
        overview = read_overview()

    assert len(overview.queues) == 8
    # Five statements, plus BEGIN and COMMIT when not already in a transaction.
    assert len(one_queue) == len(eight_queues) <= 7


def test_failed_attempts_survive_a_retry_and_count_where_they_happened() -> None:
    """Failures are read from each message's errors history, which a retry carries along:
    retrying a dead message does not take its failures off the count."""
    minute, half_hour = dt.timedelta(minutes=1), dt.timedelta(minutes=30)
    dead = DeadMessageFactory(queue="emails", errors=failed_at(half_hour, minute))
    # Failed before, then succeeded (archived), or failing still (backing off, live).
    ArchivedMessageFactory(queue="emails", errors=failed_at(half_hour))
    MessageFactory(queue="emails", attempts=1, errors=failed_at(minute))
    # Older than the hour, or with no readable time: not counted, and no error either.
    DeadMessageFactory(queue="emails", errors=failed_at(dt.timedelta(hours=2)))
    MessageFactory(queue="emails", errors=[{"at": "yesterday"}, {"at": "2026-02-31"}, 7])

    before = _by_name(read_overview())["emails"]
    assert (before.failed_5m, before.failed_60m) == (CappedCount(2), CappedCount(4))

    assert operations.retry_dead([dead.message_id]).done == [dead.message_id]
    after = _by_name(read_overview())["emails"]
    assert (after.failed_5m, after.failed_60m) == (CappedCount(2), CappedCount(4))
    assert str(after.dead) == "1"


def test_table_sizes_are_counted_before_the_first_analyze() -> None:
    """A new table's planner estimate is -1 (or 0 after analyzing it empty): the dashboard
    counts such a table exactly up to the cap instead of saying 0."""
    with connection.cursor() as cursor:
        for table in ("pgqueue_message", "pgqueue_archive", "pgqueue_dead"):
            cursor.execute(f"ANALYZE {table}")  # analyzed while empty: estimate 0
    MessageFactory.create_batch(6)
    ArchivedMessageFactory.create_batch(21)
    DeadMessageFactory.create_batch(4)

    sizes = read_overview(cap=20).table_sizes

    assert {name: str(size) for name, size in sizes.items()} == {
        "live": "6",
        "archive": "20+",
        "dead": "4",
    }
