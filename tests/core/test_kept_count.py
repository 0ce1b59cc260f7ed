"""The kept count of a limited queue's leases (the rate shards' ``held``): what optimistic
claims read instead of counting. It must never fall below the leases not given back (a claim
trusting it could exceed the limit); it may err high, and a serialized claim counts again."""

from __future__ import annotations

import datetime as dt
import threading
import time

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.test import override_settings

import django_pgqueue
from django_pgqueue.core import flow_control, sql, transitions
from django_pgqueue.models import FlowRateShard, Message

pytestmark = pytest.mark.django_db(transaction=True)

LIMITED = override_settings(PGQUEUE={"QUEUES": {"lim": {"CONCURRENCY_LIMIT": 10_000}}})


@pytest.fixture(autouse=True)
def _small_batches_read_the_kept_count(monkeypatch):
    """Claims of 10 or more read the kept count here (100 by default): small tests. Without
    claim credits, whose grants add their allowance to it (tests/core/test_credits.py)."""
    monkeypatch.setattr(flow_control, "KEPT_COUNT_BATCH", 10)
    monkeypatch.setattr(flow_control, "CREDIT_CLAIMS", 0)


def enqueue(count: int) -> None:
    django_pgqueue.enqueue_many("t", [{}] * count, queue="lim")


def lease(n: int, **kwargs) -> list[Message]:
    return Message.objects.lease("lim", worker_id="w", batch_size=n, **kwargs)


def kept() -> int:
    return sum(FlowRateShard.objects.filter(queue="lim").values_list("held", flat=True))


def leases() -> int:
    """The queue's leases not given back, counted."""
    return Message.objects.filter(queue="lim", lease_token__isnull=False).count()


def spy_on_claims(monkeypatch) -> list[tuple[bool, bool]]:
    """(optimistic, kept count) of each claim statement run."""
    runs: list[tuple[bool, bool]] = []
    real = flow_control.prepared_claim

    def spy(shape, optimistic=False, *rates, **variant):
        runs.append((optimistic, variant.get("kept_count", False)))
        return real(shape, optimistic, *rates, **variant)

    monkeypatch.setattr(flow_control, "prepared_claim", spy)
    return runs


def failure(message: Message) -> transitions.FailedAttempt:
    return transitions.FailedAttempt(
        lease=message, error=transitions.error_entry(message="boom", attempt=1), retry_in=60.0
    )


@LIMITED
def test_claims_and_acks_of_batches_keep_the_count_of_leases(monkeypatch):
    runs = spy_on_claims(monkeypatch)
    enqueue(200)
    first = lease(50)  # serialized (no state yet): counts, and sets the kept count
    second = lease(50)  # optimistic: reads the kept count, adds its own
    assert runs == [(True, True), (False, False), (True, True)]
    assert len(first) == len(second) == 50 and kept() == leases() == 100
    transitions.complete(first[:20])
    assert kept() == leases() == 80
    transitions.fail([failure(m) for m in first[20:35]])  # retried later: not leased
    assert kept() == leases() == 65
    transitions.release(second[:10])
    assert kept() == leases() == 55
    # Stale leases change nothing (fenced): nothing to take away.
    transitions.complete(first[:20])
    assert kept() == leases() == 55


@LIMITED
def test_claims_and_acks_of_a_few_count_and_leave_theirs_counted_until_a_recount(monkeypatch):
    runs = spy_on_claims(monkeypatch)
    enqueue(100)
    lease(50)  # serialized: the count set
    few = lease(5)  # optimistic, counts (a few in flight): adds its own all the same
    assert runs[-1] == (True, False)
    assert kept() == leases() == 55
    transitions.complete(few)  # after a claim that counted: left counted
    assert (kept(), leases()) == (55, 50)
    # An optimistic claim that sees the kept count too old runs serialized, which counts.
    FlowRateShard.objects.filter(queue="lim").update(counted_at=None)
    lease(20)
    assert runs[-2:] == [(True, True), (False, False)]
    assert kept() == leases() == 70


@LIMITED
def test_claims_that_count_stop_writing_their_shard_once_nobody_reads_the_kept_count(
    monkeypatch,
):
    """A queue without a rate: a claim that counts writes its ticket's shard only to keep the
    kept count. Once no serialized claim counted for RECOUNT_INTERVAL (nobody reads it), the
    next one marks its shard uncounted instead, and those after it write nothing; a claim
    that would read the kept count then runs serialized and counts everything again."""
    runs = spy_on_claims(monkeypatch)
    enqueue(100)
    lease(50)
    shards = FlowRateShard.objects.filter(queue="lim")
    shards.update(counted_at=Now() - dt.timedelta(seconds=2))
    lease(5)  # counts; marks its shard
    [marked] = shards.filter(counted_at__isnull=True)
    assert marked.shard <= flow_control.OPTIMISTIC_CLAIMS and marked.held == 5 + (
        50 if marked.shard == 1 else 0
    )
    lease(5)  # counts; writes nothing
    assert shards.get(shard=marked.shard).held == marked.held
    assert runs[-2:] == [(True, False), (True, False)]
    lease(20)  # would read the kept count: a shard is uncounted, so it runs serialized
    assert runs[-2:] == [(True, True), (False, False)]
    assert not shards.filter(counted_at__isnull=True).exists()
    assert kept() == leases() == 80


@LIMITED
def test_a_claim_that_saw_many_leases_in_flight_reads_the_kept_count_even_for_one(monkeypatch):
    """Counting costs a row per lease in flight: past KEPT_COUNT_HELD of them, claims and acks
    of one message read and keep the kept count instead."""
    monkeypatch.setattr(flow_control, "KEPT_COUNT_HELD", 60)
    runs = spy_on_claims(monkeypatch)
    enqueue(100)
    lease(50)  # serialized: saw none in flight before it
    lease(20)  # reads the kept count (a batch): saw 50
    one = lease(1)  # the last claim saw 50: counts, sees 70
    assert runs[-1] == (True, False)
    two = lease(1)  # the last claim saw 70: reads the kept count
    assert runs[-1] == (True, True)
    transitions.complete(one + two)  # and the ack keeps it
    assert kept() == leases() == 70


@LIMITED
def test_an_ack_inside_a_transaction_leaves_its_leases_counted():
    """Its shard's row lock would hold the queue's claims until the caller's transaction
    ends: the count errs high instead (safe) until the next recount."""
    enqueue(100)
    leased = lease(50) + lease(50)  # the second read the kept count: acks keep it
    with transaction.atomic():
        transitions.complete(leased[:20])
    assert (kept(), leases()) == (100, 80)
    transitions.complete(leased[20:30])  # the same, outside a transaction
    assert (kept(), leases()) == (90, 70)


@LIMITED
def test_a_recount_keeps_what_an_ack_commits_while_it_counts():
    """A serialized claim sets the kept count to its exact count, as of its snapshot: an ack
    that commits after that snapshot (its leases counted as held) and before the claim writes
    the shards is kept all the same (shard as locked now - shard as read)."""
    enqueue(300)
    leased = lease(50) + lease(50)
    assert kept() == leases() == 100
    s = connection.settings_dict
    acker = psycopg.connect(
        host=s["HOST"], port=s["PORT"], user=s["USER"], password=s["PASSWORD"], dbname=s["NAME"]
    )
    outcome: dict[str, object] = {}

    def serialized_claim() -> None:
        try:
            outcome["leased"] = len(lease(150))  # over OPTIMISTIC_BATCH: serialized
        except BaseException as exc:  # reported below
            outcome["error"] = exc
        finally:
            connections.close_all()

    try:
        # The ack, uncommitted: it holds its shard's row lock.
        ids = "{" + ",".join(str(m.id) for m in leased[:30]) + "}"
        tokens = "{" + ",".join(str(m.lease_token) for m in leased[:30]) + "}"
        acker.execute(
            transitions._counting_ack("complete", flow_control.OPTIMISTIC_CLAIMS),
            [ids, tokens, None, "lim", "lim"],
        ).fetchall()
        claim = threading.Thread(target=serialized_claim)
        claim.start()
        # The claim counts the 30 as held, then waits for the ack's shard to write it.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _waits_for_a_row_lock(acker):
            time.sleep(0.02)
        assert _waits_for_a_row_lock(acker), "the claim never waited for the ack's shard"
        acker.commit()
        claim.join(timeout=30)
    finally:
        acker.close()
    assert "error" not in outcome and outcome["leased"] == 150
    assert kept() == leases() == 100 - 30 + 150


def _waits_for_a_row_lock(other: psycopg.Connection) -> bool:
    with psycopg.connect(other.info.dsn, autocommit=True) as watcher:
        row = watcher.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND wait_event = 'transactionid' "
            "AND datname = current_database()"
        ).fetchone()
    return bool(row and row[0])


@LIMITED
def test_an_optimistic_claim_does_not_trust_a_kept_count_with_a_missing_shard(monkeypatch):
    runs = spy_on_claims(monkeypatch)
    enqueue(100)
    lease(20)
    FlowRateShard.objects.filter(queue="lim", shard=6).delete()  # an ack's shard
    lease(20)
    assert runs[-2:] == [(True, True), (False, False)]  # contended, then serialized
    assert FlowRateShard.objects.filter(queue="lim").count() == 2 * flow_control.OPTIMISTIC_CLAIMS
    assert kept() == leases() == 40


@override_settings(PGQUEUE={"QUEUES": {"lim": {"RATE_LIMIT": 1_000}}})
def test_a_queue_without_a_concurrency_limit_keeps_no_count(monkeypatch):
    runs = spy_on_claims(monkeypatch)
    enqueue(60)
    transitions.complete(lease(20) + lease(20))
    assert runs == [(True, False), (False, False), (True, False)]
    assert kept() == 0 and not FlowRateShard.objects.filter(counted_at__isnull=False).exists()
    # Its acks are the plain ones.
    assert flow_control.counted_queue("lim", connection) is None


def test_the_ack_statements_take_away_only_flow_leases_of_their_queue():
    for kind in ("complete", "fail", "release"):
        statement = transitions._counting_ack(kind, flow_control.OPTIMISTIC_CLAIMS)
        assert statement.count("uncounted AS (") == 1
        assert "fair_order < 0" in statement
        assert f"1 + {flow_control.OPTIMISTIC_CLAIMS} + pg_backend_pid()" in statement
    with pytest.raises(RuntimeError, match="changed shape"):
        sql.counting_ack("SELECT 1", "no such anchor", "done", 4)
