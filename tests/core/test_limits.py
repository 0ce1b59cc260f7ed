"""Concurrency and rate limits in the claim: strict, race-free, no slot leaks."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.test import override_settings

import django_pgqueue
from django_pgqueue.conf import SettingsError, get_settings
from django_pgqueue.core import flow_control, sql, transitions
from django_pgqueue.core.operations import pause_queue, release_leases, resume_queue
from django_pgqueue.models import FlowKeyBucket, FlowRateShard, Message

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
    assert FlowKeyBucket.objects.filter(queue="lim").count() == 2


@limits(KEY_RATE_LIMIT=50)
def test_full_key_buckets_are_dropped_and_the_claimed_keys_kept():
    """A key's bucket is full again burst / rate = 1 s after its last claim: claims then drop
    it (up to 16 a claim statement), never the bucket of a key they claim from."""
    for n in range(20):
        enqueue(f"t{n}", 2)
    assert len(lease(20)) == 20
    buckets = FlowKeyBucket.objects.filter(queue="lim")
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


# --- optimistic claims: side by side while far from every limit ------------------------------


def _optimistic_claim(n: int, worker: str = "w1") -> list[tuple[object, ...]]:
    """One optimistic claim of queue 'lim', as flow_control runs it, in one transaction."""
    config = flow_control.flow_config("lim")
    assert config is not None
    params = flow_control.claim_params(config, "lim", worker, n, 30.0)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql.FLOW_LOCK_SHARED, params)
        cursor.execute(
            flow_control.claim_statement(
                config.optimistic_shape, optimistic=True, settings=config.literals(True)
            ),
            params,
        )
        # Without the row telling the leases in flight seen (flow_control.keeps_count).
        return [row for row in cursor.fetchall() if row[0] != flow_control.HELD]


def _hold_tickets(count: int) -> psycopg.Connection:
    """Another session holding ``count`` of queue 'lim''s ticket locks until closed."""
    s = connection.settings_dict
    other = psycopg.connect(
        host=s["HOST"], port=s["PORT"], user=s["USER"], password=s["PASSWORD"], dbname=s["NAME"]
    )
    for t in range(1, count + 1):
        other.execute(
            "SELECT pg_advisory_xact_lock(%s + %s, hashtext('lim'))",
            [flow_control.LOCK_CLASS, t],
        )
    return other


@limits(FAIRNESS=True, CONCURRENCY_LIMIT=10_000, KEY_CONCURRENCY_LIMIT=1_000)
def test_an_optimistic_claim_needs_a_ticket_and_room_to_spare():
    enqueue("a", 3)
    # The queue has no state row yet: the first claim is serialized (and creates it).
    assert [o for o, *_ in _optimistic_claim(1)] == [flow_control.CONTENDED]
    assert len(lease(1)) == 1
    assert [o for o, *_ in _optimistic_claim(1)] == ["claimed"]
    # Every ticket taken by other claims: no optimistic claim now.
    other = _hold_tickets(flow_control.OPTIMISTIC_CLAIMS)
    try:
        assert [o for o, *_ in _optimistic_claim(1)] == [flow_control.CONTENDED]
        assert len(lease(1)) == 1  # served all the same, serialized
    finally:
        other.close()


@limits(FAIRNESS=True, CONCURRENCY_LIMIT=10_000, KEY_CONCURRENCY_LIMIT=400)
def test_an_optimistic_claim_needs_room_under_every_key():
    """Key limit 400 = the margin (4 tickets x 100): a key with one in flight is too close."""
    enqueue("a", 2)
    assert len(lease(1)) == 1  # serialized (creates the state row)
    assert [o for o, *_ in _optimistic_claim(1)] == [flow_control.CONTENDED]


def test_an_optimistic_claim_skips_the_per_key_machinery_unless_a_key_has_a_rate():
    """Key limits, default or per key: an optimistic claim runs only ``margin`` away from the
    smallest, so it takes the fair choice as is. A key rate keeps the keyed statement."""
    FlowConfig = flow_control.FlowConfig
    for config in (
        FlowConfig(fairness=True, key_concurrency_limit=1_000),
        FlowConfig(fairness=True, key_concurrency_limit=1_000, key_concurrency_limits={"a": 500}),
        FlowConfig(key_concurrency_limits={"a": 500, "b": 2_000}),
    ):
        assert (config.shape, config.optimistic_shape) == ("keyed", "fair_limits"), config
        assert config.counted
    keyed_rate = FlowConfig(fairness=True, key_concurrency_limit=1_000, key_rate_limit=1_000.0)
    assert keyed_rate.optimistic_shape == "keyed"
    assert keyed_rate.optimistic_settings_literals == keyed_rate.settings_literals
    # Without fairness the claim order is the plain one: the shape stays "limits".
    assert FlowConfig(concurrency_limit=5).optimistic_shape == "limits"
    assert not FlowConfig(fairness=True, rate_limit=5.0).counted


def test_the_smallest_key_limit_is_the_one_an_optimistic_claim_keeps_its_margin_from():
    FlowConfig = flow_control.FlowConfig
    assert FlowConfig(key_concurrency_limit=1_000).least_key_limit == 1_000
    assert FlowConfig(key_concurrency_limits={"a": 500, "b": 2_000}).least_key_limit == 500
    config = FlowConfig(key_concurrency_limit=300, key_concurrency_limits={"vip": 5_000})
    assert config.least_key_limit == 300
    assert FlowConfig(concurrency_limit=9).least_key_limit is None
    optimistic = dict(config.optimistic_settings_literals)
    assert optimistic["key_limit"] == "(300::int)" and optimistic["key_limits"] == "('{}'::jsonb)"
    assert dict(config.settings_literals)["key_limits"] == """('{"vip": 5000}'::jsonb)"""


@limits(FAIRNESS=True, KEY_CONCURRENCY_LIMITS={"a": 401, "vip": 5_000})
def test_an_optimistic_claim_keeps_its_margin_from_the_smallest_per_key_limit():
    """Per-key limits alone (no default): "a" may have 401 in flight, one more than the
    margin (4 tickets x 100). With one message in flight, whichever key's, an optimistic claim
    still has room; with two the queue's whole in flight no longer leaves "a"'s limit the
    margin away: it answers contended, and the claim runs serialized, counting key by key."""
    enqueue("vip", 4)
    assert len(lease(1)) == 1  # serialized: creates the state row and the shards
    assert [o for o, *_ in _optimistic_claim(1)] == ["claimed"]  # 401 - 1 >= 400
    assert [o for o, *_ in _optimistic_claim(1)] == [flow_control.CONTENDED]  # 401 - 2 < 400
    assert len(lease(1)) == 1  # served all the same, serialized


def _small_optimistic_claims(monkeypatch, claims: int, batch: int) -> list[tuple[bool, bool]]:
    """Optimistic claims of up to ``batch`` messages, ``claims`` at once; returns the list of
    (optimistic, went ahead) outcomes the claims append to."""
    monkeypatch.setattr(flow_control, "OPTIMISTIC_CLAIMS", claims)
    monkeypatch.setattr(flow_control, "OPTIMISTIC_BATCH", batch)
    outcomes: list[tuple[bool, bool]] = []
    real_claim = flow_control._claim

    def spy(connection, alias, config, shape, optimistic, lock, params, placing=True):
        rows = real_claim(connection, alias, config, shape, optimistic, lock, params, placing)
        outcomes.append((optimistic, not any(r[0] == flow_control.CONTENDED for r in rows)))
        return rows

    monkeypatch.setattr(flow_control, "_claim", spy)
    return outcomes


def _drain_six_tenants_within_limits(outcomes: list[tuple[bool, bool]]) -> None:
    """Six tenants' 15 messages each drained by 6 claimers in batches of 3: each leased once,
    the queue limit 10 and the key limit 8 held (and the queue's reached), and both
    optimistic and serialized claims went ahead (``outcomes``: _small_optimistic_claims)."""
    for tenant in "abcdef":
        enqueue(tenant, 15)
    done, queue_peak, key_peak = drain_recording_peaks(6, batch=3, hold=0.02)
    assert len(done) == len(set(done)) == 90
    assert queue_peak <= 10 and key_peak <= 8
    assert queue_peak >= 7  # the limit was actually reached
    assert (True, True) in outcomes and (False, True) in outcomes


@pytest.mark.parametrize("kept_count", [False, True], ids=["counting", "kept-count"])
@limits(CONCURRENCY_LIMIT=10, KEY_CONCURRENCY_LIMIT=8, FAIRNESS=True)
def test_limits_hold_while_claims_go_from_optimistic_to_serialized(monkeypatch, kept_count):
    """With a margin of 2 x 3 = 6, claims of 3 are optimistic while 4 or fewer are in flight
    (and no key has more than 2) and serialized beyond: the limits hold across both, under
    concurrent claimers; whether optimistic claims count what is in flight or read the count
    that claims and acks keep (every ack keeping it here)."""
    outcomes = _small_optimistic_claims(monkeypatch, claims=2, batch=3)
    knobs = (1, 0) if kept_count else (10**9, 10**9)
    monkeypatch.setattr(flow_control, "KEPT_COUNT_BATCH", knobs[0])
    monkeypatch.setattr(flow_control, "KEPT_COUNT_HELD", knobs[1])
    # Every ack keeps it (not only those after a claim that read it): exact to the end.
    monkeypatch.setattr(flow_control.LEASES_SEEN, "keeps_count", lambda *_: kept_count)
    _drain_six_tenants_within_limits(outcomes)
    kept = sum(FlowRateShard.objects.filter(queue="lim").values_list("held", flat=True))
    # Every lease given back: the kept count is exactly 0 when every ack kept it, whatever
    # the interleaving of claims, acks and recounts; it errs high when none did.
    assert (kept == 0) if kept_count else (kept >= 0), kept


@limits(CONCURRENCY_LIMIT=10, FAIRNESS=True, KEY_CONCURRENCY_LIMITS=dict.fromkeys("abcdef", 8))
def test_per_key_limits_hold_while_claims_go_from_optimistic_to_serialized(monkeypatch):
    """Every tenant with a limit of its own (8) and no default: claims of 3 are optimistic
    while the queue's whole in flight leaves 8 a margin of 2 x 3 away (2 or fewer in flight),
    without counting key by key, and serialized beyond: the limits hold across both."""
    outcomes = _small_optimistic_claims(monkeypatch, claims=2, batch=3)
    _drain_six_tenants_within_limits(outcomes)


@limits(FAIRNESS=True, KEY_CONCURRENCY_LIMIT=3)
def test_a_key_limit_holds_where_claims_stop_skipping_the_per_key_counts():
    """While the queue's whole in flight plus the batch stays within the key limit, no key
    can reach it and the claim skips the per-key counts; past that point it counts again."""
    enqueue("a", 6)
    assert len(lease(2)) == 2  # 0 in flight + 2 <= 3: the fair choice as is
    assert len(lease(2)) == 1  # 2 + 2 > 3: counted per key, "a" has room for one
    assert lease(2) == []
    enqueue("b", 2)
    assert [m.tenant for m in lease(2)] == ["b", "b"]


def _tenants_counted(n: int) -> int:
    """How many times a serialized claim of ``n`` from queue 'lim' counted its tenants' leases
    in flight (EXPLAIN ANALYZE, rolled back)."""
    from tests.plans import nodes

    config = flow_control.flow_config("lim")
    assert config is not None
    params = flow_control.claim_params(config, "lim", "w1", n, 30.0)
    statement = flow_control.claim_statement(config.shape, settings=config.literals(False))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql.FLOW_LOCK, params)
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    in_flight = next(node for node in nodes(plan) if node.get("Subplan Name") == "CTE in_flight")
    # Planned away altogether when the settings decide (no key limit): no scan at all.
    scans = [n for n in nodes([{"Plan": in_flight}]) if n.get("Relation Name") == "pgqueue_message"]
    return sum(scan["Actual Loops"] for scan in scans)


@limits(FAIRNESS=True, KEY_CONCURRENCY_LIMIT=20, KEY_RATE_LIMIT=1_000)
def test_a_keyed_claim_counts_tenants_leases_only_near_the_smallest_key_limit(monkeypatch):
    """With a margin of 2 x 3 = 6: while the queue's whole in flight leaves the key limit 20
    at least max(6, the batch) away, no tenant can reach it, and the claim does not count
    each tenant's leases (it does once closer); the limit holds across the switch."""
    _small_optimistic_claims(monkeypatch, claims=2, batch=3)
    enqueue("a", 30)
    assert _tenants_counted(2) == 0
    assert len(lease(14)) == 14  # 20 - 14 = 6 >= max(6, 2): still far
    assert _tenants_counted(2) == 0
    assert _tenants_counted(7) == 1  # a batch of 7 might reach it
    assert len(lease(1)) == 1  # 20 - 15 < 6: counted from here on
    assert _tenants_counted(2) == 1
    assert len(lease(10)) == 5  # "a" is at its limit of 20
    assert lease(1) == []


@limits(FAIRNESS=True, KEY_RATE_LIMIT=1_000)
def test_a_key_rate_alone_never_counts_tenants_leases(monkeypatch):
    _small_optimistic_claims(monkeypatch, claims=2, batch=3)
    enqueue("a", 30)
    assert len(lease(20)) == 20
    assert _tenants_counted(5) == 0


@limits(FAIRNESS=True, KEY_CONCURRENCY_LIMITS={"a": 3})
def test_a_per_key_limit_holds_where_claims_stop_skipping_the_per_key_counts():
    """The same with a tenant's own limit and no default: the smallest key limit decides."""
    enqueue("a", 6)
    assert len(lease(2)) == 2  # 0 in flight + 2 <= 3: the fair choice as is
    assert len(lease(2)) == 1  # 2 + 2 > 3: counted per key, "a" has room for one
    assert lease(2) == []
    enqueue("b", 2)
    assert [m.tenant for m in lease(2)] == ["b", "b"]  # "b" has no limit of its own


@limits(FAIRNESS=True, CONCURRENCY_LIMIT=10_000, KEY_CONCURRENCY_LIMIT=1_000)
def test_a_claim_session_claims_with_limits_on_the_driver_with_the_same_rows(monkeypatch, caplog):
    """On a worker's claim session, a claim with limits sends its lock and its claim straight
    to the driver, one pipeline: the same messages, columns and types as Django's cursor
    path; a vanished statement falls back to that path."""
    from django_pgqueue.core import execution

    ids = enqueue("a", 3) + enqueue("b", 3)
    plain = lease(1)[0]  # serialized, through Django's cursor
    execution.dedicate_to_claims(connection)
    sent: list[tuple[str, str]] = []
    real = flow_control.run_on_driver

    def spy(*args, **kwargs):
        sent.append((kwargs["first"][1], kwargs["statement"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(flow_control, "run_on_driver", spy)
    try:
        fast = lease(10)  # optimistic: shared lock, then the claim
        shared_lock = flow_control._lock_body(sql.FLOW_LOCK_SHARED)
        config = flow_control.flow_config("lim")
        assert config is not None
        claims = {  # head-only or placing, by the placing schedule's clock
            flow_control.numbered_claim(
                "fair_limits", True, True, False, placing=p, settings=config.literals(True)
            )
            for p in (True, False)
        }
        assert len(sent) == 1 and sent[0][0] == shared_lock and sent[0][1] in claims
        assert sorted([plain.id] + [m.id for m in fast]) == sorted(ids)
        assert [plain.tenant] + [m.tenant for m in fast] == ["a", "b", "a", "b", "a", "b"]
        row = Message.objects.get(id=fast[0].id)
        for field in ("queue", "task", "tenant", "attempts", "lease_token", "leased_by"):
            assert getattr(fast[0], field) == getattr(row, field), field
            assert type(getattr(fast[0], field)) is type(getattr(plain, field)), field
        assert fast[0].leased_at == row.leased_at and fast[0].payload == row.payload
        complete(fast)
        enqueue("c", 2)
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")
        with caplog.at_level("WARNING", logger="django_pgqueue"):
            assert [m.tenant for m in lease(10)] == ["c", "c"]
        assert "prepared statement vanished" in caplog.text
    finally:
        execution.end_claim_session(connection)


@limits(FAIRNESS=True, CONCURRENCY_LIMIT=2)
def test_a_claim_session_without_pipelines_claims_with_limits_through_djangos_cursor(monkeypatch):
    """With a libpq too old for pipeline mode, a claim session's claim with limits goes
    through Django's cursor (lock and claim in one query string), limits and all."""
    from django_pgqueue.core import execution

    enqueue("a", 3)
    execution.dedicate_to_claims(connection)
    monkeypatch.setattr(flow_control, "can_pipeline", lambda: False)
    on_driver: list[object] = []
    monkeypatch.setattr(flow_control, "run_on_driver", lambda *a, **k: on_driver.append(k))
    try:
        assert [m.tenant for m in lease(5)] == ["a", "a"]  # the queue limit holds
        assert lease(5) == [] and on_driver == []
    finally:
        execution.end_claim_session(connection)


def database_seconds() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        return float(cursor.fetchone()[0])


@limits(RATE_LIMIT=40, FAIRNESS=True)
def test_a_sharded_rate_bucket_gives_the_burst_once_across_optimistic_and_serialized_claims(
    monkeypatch,
):
    """The bucket is split in one shard per optimistic claim (2 here, 20 tokens each): an
    optimistic claim spends its own shard, a serialized one takes from all; together they
    never give more than the burst, and the refill follows the database clock."""
    outcomes = _small_optimistic_claims(monkeypatch, claims=2, batch=10)
    enqueue("a", 60)
    started = database_seconds()
    taken = [len(lease(10)) for _ in range(5)]
    refill = 40 * (database_seconds() - started)  # what the rate adds meanwhile (database time)
    assert 40 <= sum(taken) <= 40 + refill + 1  # the burst, once
    assert taken[:4] == [10, 10, 10, 10]
    # serialized (no state yet), optimistic (shard 1: 15 -> 5), then serialized from both
    assert outcomes[:2] == [(True, False), (False, True)]
    assert (True, True) in outcomes
    # A shard per ticket, and as many more for acks to keep the count of leases in (unused
    # here: no limit) with no tokens.
    shards = FlowRateShard.objects.filter(queue="lim")
    assert sorted(shards.values_list("shard", flat=True)) == [1, 2, 3, 4]
    assert {s.tokens for s in shards if s.shard > 2} == {0.0}
    time.sleep(0.3)
    assert 8 <= len(lease(20)) <= 15  # ~12 tokens refilled


@limits(RATE_LIMIT=400)
def test_optimistic_claims_with_a_rate_do_not_wait_for_each_other(monkeypatch):
    """Two optimistic claims at once spend different shards: the second does not wait for
    the first one's transaction (a single bucket row would make it wait: lock_timeout)."""
    _small_optimistic_claims(monkeypatch, claims=2, batch=10)
    enqueue(None, 40)
    assert len(lease(10)) == 10  # serialized: creates the state row and the shards
    config = flow_control.flow_config("lim")
    assert config is not None
    statement = flow_control.claim_statement(
        config.shape, optimistic=True, settings=config.literals(True)
    )
    s = connection.settings_dict
    other = psycopg.connect(
        host=s["HOST"], port=s["PORT"], user=s["USER"], password=s["PASSWORD"], dbname=s["NAME"]
    )
    try:
        other.execute("SET lock_timeout = '2s'")
        with transaction.atomic(), connection.cursor() as cursor:
            params = flow_control.claim_params(config, "lim", "w1", 10, 30.0)
            cursor.execute(sql.FLOW_LOCK_SHARED, params)
            cursor.execute(statement, params)
            assert [o for o, *_ in cursor.fetchall()] == ["claimed"] * 10
            # Still in the first claim's transaction: its shard's row is locked.
            params = flow_control.claim_params(config, "lim", "w2", 10, 30.0)
            with other.transaction():
                other.execute(sql.FLOW_LOCK_SHARED, params)
                rows = other.execute(statement, params).fetchall()
            assert [o for o, *_ in rows] == ["claimed"] * 10
    finally:
        other.close()


@limits(RATE_LIMIT=400)
def test_rate_limit_holds_across_concurrent_optimistic_claimers(monkeypatch):
    outcomes = _small_optimistic_claims(monkeypatch, claims=4, batch=10)
    enqueue(None, 2000)
    claimed, elapsed = claim_for_a_second(pause=0.0)
    assert claimed <= 400 + 400 * elapsed + 1
    assert claimed >= 0.7 * (400 + 400 * 1.0)
    assert (True, True) in outcomes


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
