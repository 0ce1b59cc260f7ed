"""Concurrency and rate limits in the claim: strict, race-free, no slot leaks."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable

import pytest
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.test import override_settings

import django_pgqueue
from django_pgqueue.conf import SettingsError, get_settings
from django_pgqueue.core import _claim_sql, _flow_control, transitions
from django_pgqueue.core.operations import pause_queue, release_leases, resume_queue
from django_pgqueue.models import FlowRate, Message
from tests.sessions import lose_prepared_statements

pytestmark = pytest.mark.django_db(transaction=True)


def lease(n: int = 1, queue: str = "lim", worker: str = "w1", **kwargs) -> list[Message]:
    return Message.objects.lease(queue, worker_id=worker, batch_size=n, **kwargs)


def enqueue(tenant: str | None, count: int = 1, queue: str = "lim") -> list[int]:
    return [
        django_pgqueue.enqueue("t", {"n": n}, queue=queue, tenant=tenant).id for n in range(count)
    ]


def complete(messages: list[Message]) -> None:
    transitions.complete(messages)


def limits(**queue_settings: object) -> override_settings:
    return override_settings(PGQUEUE={"BACKOFF_JITTER": 0.0, "QUEUES": {"lim": queue_settings}})


def expire(messages: list[Message]) -> None:
    """Simulate a crashed worker: its leases ran out (database time)."""
    Message.objects.filter(id__in=[m.id for m in messages]).update(available_at=Now())


# --- queue-wide concurrency limit -----------------------------------------------------------


@limits(CONCURRENCY_LIMIT=2)
def test_queue_limit_caps_the_batch_and_a_completion_frees_a_slot():
    enqueue(None, 5)
    first = lease(5)
    assert len(first) == 2
    assert lease(5, worker="w2") == []
    complete(first[:1])
    assert len(lease(5, worker="w2")) == 1
    # What counts as in flight is the leases themselves: nothing else to sweep.
    assert Message.objects.filter(lease_token__isnull=False, fair_order=-1).count() == 2


@limits(CONCURRENCY_LIMIT=1)
def test_an_expired_lease_frees_its_slot_and_the_message_is_redelivered():
    [a] = enqueue(None, 1)
    [held] = lease(1)
    assert held.id == a and lease(1, worker="w2") == []
    expire([held])
    [again] = lease(1, worker="w2")
    assert again.id == a and again.redelivered and again.attempts == 2


@limits(CONCURRENCY_LIMIT=1)
def test_failed_released_and_operator_released_leases_free_their_slot():
    enqueue(None, 3)
    [m] = lease(1)
    transitions.fail([transitions.FailedAttempt(m, {"type": "E", "message": "x"}, retry_in=60)])
    [m] = lease(1)
    transitions.release([m])
    [m] = lease(1)
    release_leases([m.id])
    assert len(lease(1)) == 1


@limits(CONCURRENCY_LIMIT=1)
def test_hold_mode_takes_the_slot_in_the_callers_transaction():
    enqueue(None, 2)
    with transaction.atomic():
        [m] = lease(1, hold=True)
        transitions.complete([m])
    assert len(lease(1)) == 1


# --- per-key concurrency limit --------------------------------------------------------------


@limits(KEY_CONCURRENCY_LIMIT=1, KEY_CONCURRENCY_LIMITS={"wide": 3})
def test_key_limits_hold_per_key_with_overrides():
    enqueue("narrow", 5)
    enqueue("wide", 5)
    leased = lease(10)
    by_key = defaultdict(int)
    for m in leased:
        by_key[m.tenant] += 1
    assert by_key == {"narrow": 1, "wide": 3}
    assert lease(10, worker="w2") == []


@limits(KEY_CONCURRENCY_LIMIT=1)
def test_key_limit_one_runs_a_keys_messages_one_at_a_time_in_order():
    ids = enqueue("k", 4)
    enqueue(None, 1)  # messages without a key are not limited by it
    seen: list[int] = []
    for _ in range(4):
        batch = [m for m in lease(10) if m.tenant == "k"]
        assert len(batch) == 1
        seen.append(batch[0].id)
        complete(batch)
    assert seen == ids


@limits(KEY_CONCURRENCY_LIMIT=1)
def test_an_expired_lease_frees_its_key_slot():
    [a, b] = enqueue("k", 2)
    [held] = lease(5)
    assert held.id == a and lease(5) == []
    expire([held])
    # The slot is free again; the redelivered message queues by its new available time.
    [nxt] = lease(5)
    assert nxt.id == b
    complete([nxt])
    [again] = lease(5)
    assert again.id == a and again.redelivered


# --- rate limits -----------------------------------------------------------------------------


def db_clock() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())")
        return float(cursor.fetchone()[0])


@limits(RATE_LIMIT=10)
def test_queue_rate_limit_is_a_token_bucket_in_database_time():
    enqueue(None, 40)
    assert len(lease(40)) == 10  # the burst: one second's worth
    assert lease(40) == []
    time.sleep(0.35)
    got = len(lease(40))
    assert 2 <= got <= 5  # ~3.5 tokens refilled (database clock, scheduling slack)


@limits(KEY_RATE_LIMIT=2)
def test_key_rate_limit_holds_per_key_and_leaves_other_keys_alone():
    enqueue("slow", 10)
    enqueue("other", 10)
    first = lease(20)
    assert sorted(m.tenant for m in first) == ["other", "other", "slow", "slow"]
    assert lease(20) == []
    assert FlowRate.objects.filter(queue="lim").exclude(key="").count() == 2


@limits(KEY_RATE_LIMIT=50)
def test_full_key_buckets_are_dropped_and_the_claimed_keys_kept():
    """A key's rate row is dropped once its bucket has been full again for a second (up to 16
    a claim), never the row of a key the claim takes from."""
    for n in range(20):
        enqueue(f"t{n}", 2)
    assert len(lease(20)) == 20
    buckets = FlowRate.objects.filter(queue="lim").exclude(key="")
    assert buckets.count() == 20
    assert len(lease(1)) == 1  # within the second: nothing is idle yet
    assert buckets.count() == 20
    time.sleep(1.1)
    claimed = {m.tenant for m in lease(1)} | {m.tenant for m in lease(1)}
    assert set(buckets.values_list("key", flat=True)) == claimed


# --- pause -----------------------------------------------------------------------------------


@limits(CONCURRENCY_LIMIT=5)
def test_paused_limited_queue_is_not_claimed_from_and_resumes():
    enqueue(None, 2)
    pause_queue("lim")
    assert lease(5) == []
    resume_queue("lim")
    assert len(lease(5)) == 2


def test_paused_plain_queue_is_not_claimed_from_and_resumes():
    enqueue(None, 2, queue="plain")
    pause_queue("plain")
    assert lease(5, queue="plain") == []
    resume_queue("plain")
    assert len(lease(5, queue="plain")) == 2


# --- many workers at once (threads, one connection each) -------------------------------------


def run_workers(count: int, body: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def target(n: int) -> None:
        try:
            body(n)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=target, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors


def in_flight_now() -> tuple[int, int]:
    """What the database counts in flight in queue 'lim' now: in all, and its busiest key's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(sum(c), 0), COALESCE(max(c), 0) FROM (SELECT count(*) c "
            "FROM pgqueue_message WHERE queue = 'lim' AND lease_token IS NOT NULL "
            "AND available_at > now() GROUP BY tenant) k"
        )
        total, per_key = cursor.fetchone()
    return int(total), int(per_key)


def drain_recording_peaks(claimers: int, batch: int, hold: float) -> tuple[list[int], int, int]:
    """Claimer threads drain queue 'lim', each holding what it leased for ``hold`` s; the ids
    leased, and the most messages in flight the database counted (queue, one key)."""
    peaks = {"queue": 0, "key": 0}
    done: list[int] = []
    guard = threading.Lock()

    def worker(n: int) -> None:
        while True:
            leased = lease(batch, worker=f"w{n}")
            if not leased:
                if not Message.objects.filter(queue="lim", lease_token__isnull=True).exists():
                    return
                time.sleep(0.002)
                continue
            total, per_key = in_flight_now()
            with guard:
                peaks["queue"] = max(peaks["queue"], total)
                peaks["key"] = max(peaks["key"], per_key)
                done.extend(m.id for m in leased)
            time.sleep(hold)  # hold the slots long enough for other claimers to collide
            complete(leased)

    run_workers(claimers, worker)
    return done, peaks["queue"], peaks["key"]


@limits(CONCURRENCY_LIMIT=6, KEY_CONCURRENCY_LIMIT=2, FAIRNESS=True)
def test_limits_hold_under_concurrent_claimers():
    for tenant in ("a", "b", "c", "d", "e"):
        enqueue(tenant, 12)
    done, queue_peak, key_peak = drain_recording_peaks(6, batch=3, hold=0.03)
    assert len(done) == len(set(done)) == 60
    assert queue_peak <= 6 and key_peak <= 2
    assert queue_peak >= 4  # the limit was actually reached, not trivially respected


@limits(KEY_CONCURRENCY_LIMIT=1)
def test_key_limit_one_keeps_each_keys_order_under_concurrent_claimers():
    expected = {tenant: enqueue(tenant, 8) for tenant in ("a", "b", "c")}
    order: dict[str, list[int]] = defaultdict(list)
    lock = threading.Lock()

    def worker(n: int) -> None:
        while Message.objects.filter(queue="lim").exists():
            leased = lease(2, worker=f"w{n}")
            for m in leased:
                time.sleep(0.002)
                with lock:
                    order[m.tenant].append(m.id)
                complete([m])
            if not leased:
                time.sleep(0.002)

    run_workers(4, worker)
    assert dict(order) == expected


def claim_for_a_second(pause: float) -> tuple[int, float]:
    """4 concurrent claimers of 10 for one second (database clock): (claimed, elapsed)."""
    counts: list[int] = []
    lock = threading.Lock()
    start = db_clock()

    def worker(n: int) -> None:
        while db_clock() - start < 1.0:
            got = len(lease(10, worker=f"w{n}"))
            with lock:
                counts.append(got)
            time.sleep(pause)

    run_workers(4, worker)
    return sum(counts), db_clock() - start


@limits(RATE_LIMIT=25)
def test_rate_limit_holds_across_concurrent_claimers():
    enqueue(None, 200)
    claimed, elapsed = claim_for_a_second(pause=0.005)
    # Strict upper bound: the burst plus the refill over the elapsed database time.
    assert claimed <= 25 + 25 * elapsed + 1
    assert claimed >= 25 + 25 * 0.8 * 1.0 - 5  # and not throttled far below the rate


# --- allowances: claims that count nothing while far from every limit ------------------------


def database_seconds() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        return float(cursor.fetchone()[0])


def allowance(queue: str = "lim") -> int:
    """This session's allowance of ``queue`` (units left, 0 when none or expired)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(sum(units) FILTER (WHERE until > clock_timestamp()), 0) "
            "FROM pgqueue_flow_allowance WHERE queue = %s AND holder = pg_backend_pid()",
            [queue],
        )
        return int(cursor.fetchone()[0])


@limits(FAIRNESS=True, CONCURRENCY_LIMIT=10_000, KEY_CONCURRENCY_LIMIT=1_000)
def test_an_exact_claim_far_from_every_limit_reserves_an_allowance_the_next_claims_spend():
    enqueue("a", 30)
    assert len(lease(2)) == 2  # exact: counts, then reserves 32 batches' worth
    assert allowance() == 2 * _flow_control.ALLOWANCE_CLAIMS
    assert len(lease(2)) == 2
    assert allowance() == 2 * _flow_control.ALLOWANCE_CLAIMS - 2


@limits(FAIRNESS=True, CONCURRENCY_LIMIT=100)
def test_an_allowance_is_a_quarter_of_the_room_left():
    enqueue("a", 30)
    assert len(lease(10)) == 10
    assert allowance() == (100 - 10) // 4


@limits(FAIRNESS=True, CONCURRENCY_LIMIT=10_000, KEY_CONCURRENCY_LIMIT=1_000)
def test_a_claim_never_comes_back_short_for_want_of_allowance():
    """The first claim (exact) reserves 2.25 batches; the next two take their batch from
    it, and the fourth claims exactly rather than take the quarter batch left (a short claim
    tells a worker that the queue ran out or a limit binds)."""
    enqueue("a", 500)
    taken = [lease(100) for _ in range(4)]
    assert [len(batch) for batch in taken] == [100, 100, 100, 100]
    complete([m for batch in taken for m in batch])
    assert len(lease(100)) == 100


@limits(FAIRNESS=True, KEY_CONCURRENCY_LIMIT=1_000, KEY_CONCURRENCY_LIMITS={"vip": 3})
def test_the_smallest_key_limit_bounds_an_allowance():
    enqueue("a", 5)
    assert len(lease(1)) == 1
    assert allowance() == 0  # all of it could go to "vip": (3 - 1) // 4


@limits(FAIRNESS=True, KEY_RATE_LIMIT=1_000)
def test_no_allowance_with_a_key_rate_nor_inside_a_transaction():
    enqueue("a", 5)
    assert len(lease(1)) == 1 and allowance() == 0
    with override_settings(
        PGQUEUE={"QUEUES": {"lim": {"FAIRNESS": True, "CONCURRENCY_LIMIT": 1_000}}}
    ):
        with transaction.atomic():
            assert len(lease(1, hold=True)) == 1
            assert allowance() == 0


@limits(FAIRNESS=True, CONCURRENCY_LIMIT=1_000)
def test_an_expired_allowance_stops_counting_and_its_tokens_go_back(monkeypatch):
    enqueue("a", 10)
    assert len(lease(1)) == 1 and allowance() > 0
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgqueue_flow_allowance SET until = clock_timestamp()")
    assert allowance() == 0
    assert len(lease(1)) == 1  # exact again: settles the expired one, reserves anew
    assert allowance() > 0


@limits(FAIRNESS=True, RATE_LIMIT=40)
def test_a_rate_gives_its_burst_once_across_exact_claims_and_allowances():
    enqueue("a", 60)
    started = database_seconds()
    taken = [len(lease(10)) for _ in range(5)]
    refill = 40 * (database_seconds() - started)  # what the rate adds meanwhile (database time)
    assert 40 <= sum(taken) <= 40 + refill + 1  # the burst, once
    time.sleep(0.3)
    assert 8 <= len(lease(20)) <= 15  # ~12 tokens refilled


@limits(FAIRNESS=True, CONCURRENCY_LIMIT=40, KEY_CONCURRENCY_LIMIT=30)
def test_limits_hold_while_sessions_claim_under_allowances():
    """Allowances of a few messages each, 6 claimers of 3: the limits hold and are reached
    while claims go from exact to allowances and back."""
    for tenant in "abcdef":
        enqueue(tenant, 40)
    done, queue_peak, key_peak = drain_recording_peaks(6, batch=3, hold=0.02)
    assert len(done) == len(set(done)) == 240
    assert queue_peak <= 40 and key_peak <= 30
    assert queue_peak >= 15  # six claimers of 3 held at once: the room was used


@limits(RATE_LIMIT=400)
def test_rate_limit_holds_across_concurrent_claimers_under_allowances():
    enqueue(None, 2000)
    claimed, elapsed = claim_for_a_second(pause=0.0)
    assert claimed <= 400 + 400 * elapsed + 1
    assert claimed >= 0.7 * (400 + 400 * 1.0)


@limits(FAIRNESS=True, CONCURRENCY_LIMIT=10_000, KEY_CONCURRENCY_LIMIT=1_000)
def test_a_claim_session_claims_with_limits_on_the_driver_with_the_same_rows(monkeypatch, caplog):
    """On a worker's claim session, a claim with limits goes straight to the driver: the
    same messages, columns and types as Django's cursor path; a vanished statement falls
    back to that path."""
    from django_pgqueue.core import _execution, _send

    ids = enqueue("a", 3) + enqueue("b", 3)
    plain = lease(1)[0]  # through Django's cursor
    _execution.dedicate_to_claims(connection)
    sent: list[tuple[str, object]] = []
    real = _send.run

    def spy(*args, **kwargs):
        sent.append((args[1], kwargs["plan"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(_send, "run", spy)
    try:
        fast = lease(10)
        assert sent == [(_claim_sql.FLOW_CLAIM, {})]  # no settings sent with it
        assert sorted([plain.id] + [m.id for m in fast]) == sorted(ids)
        assert [plain.tenant] + [m.tenant for m in fast] == ["a", "b", "a", "b", "a", "b"]
        row = Message.objects.get(id=fast[0].id)
        for field in ("queue", "task", "tenant", "attempts", "lease_token", "leased_by"):
            assert getattr(fast[0], field) == getattr(row, field), field
            assert type(getattr(fast[0], field)) is type(getattr(plain, field)), field
        assert fast[0].leased_at == row.leased_at and fast[0].payload == row.payload
        complete(fast)
        enqueue("c", 2)
        lose_prepared_statements(connection)
        with caplog.at_level("WARNING", logger="django_pgqueue"):
            assert [m.tenant for m in lease(10)] == ["c", "c"]
        assert "prepared statement vanished" in caplog.text
    finally:
        _execution.end_dedicated_session(connection)


# --- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"FAIRNESS": "yes"}, "'FAIRNESS'] must be True or False"),
        ({"TENANT_WEIGHTS": {"a": 0}}, "'TENANT_WEIGHTS'] must be a dict of tenant"),
        ({"CONCURRENCY_LIMIT": 1.5}, "'CONCURRENCY_LIMIT'] must be None or a whole number"),
        ({"KEY_CONCURRENCY_LIMIT": 0}, "'KEY_CONCURRENCY_LIMIT'] must be None or a whole"),
        ({"KEY_CONCURRENCY_LIMITS": {"k": -1}}, "'KEY_CONCURRENCY_LIMITS'] must be a dict"),
        ({"RATE_LIMIT": 0}, "'RATE_LIMIT'] must be None or a number of messages"),
        ({"KEY_RATE_LIMIT": "fast"}, "'KEY_RATE_LIMIT'] must be None or a number"),
    ],
)
def test_bad_flow_settings_are_precise_errors(overrides, fragment):
    with override_settings(PGQUEUE={"QUEUES": {"lim": overrides}}):
        with pytest.raises(SettingsError) as info:
            get_settings()
    assert fragment in str(info.value) and info.value.check_id == "E003"
