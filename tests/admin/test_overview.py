"""The dashboard numbers: exact below the cap, marked "N+" above it, bounded statements."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_pgqueue.admin.overview import CappedCount, known_queues, read_overview
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
    DeadMessageFactory.create_batch(2, queue="emails")
    DeadMessageFactory(queue="emails", died_at=NOW() - dt.timedelta(minutes=30))
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
    DeadMessageFactory.create_batch(6, queue="big")

    big = _by_name(read_overview(cap=5, throughput_cap=5))["big"]

    assert big.ready == CappedCount(5, capped=True)
    assert str(big.ready) == "5+"
    assert big.scheduled.capped and big.scheduled.value == 5
    assert big.dead == CappedCount(5, capped=True)
    assert big.failed_5m == CappedCount(5, capped=True)


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
