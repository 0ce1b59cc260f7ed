"""Claim credits: an optimistic claim far from every limit grants its session an allowance
that it leases with claims of fairness alone (no count, no bucket) until a deadline in
database time. Every other claim counts the allowance as in flight, so the limits hold."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter

import pytest
from django.db import connection, connections
from django.db.models.functions import Now

from django_pgqueue.core import flow_control
from django_pgqueue.core.operations import pause_queue, resume_queue
from django_pgqueue.models import FlowCredit, FlowRateShard, Message
from tests.core.test_limits import complete, enqueue, in_flight_now, lease, limits, run_workers

pytestmark = pytest.mark.django_db(transaction=True)

FAR_FROM_LIMITS = limits(
    FAIRNESS=True, CONCURRENCY_LIMIT=10_000, KEY_CONCURRENCY_LIMIT=1_000, RATE_LIMIT=100_000
)


def spy_on_claims(monkeypatch) -> list[str]:
    """The kind of each claim statement run: ``credit``, ``optimistic`` or ``serialized``."""
    runs: list[str] = []
    real = flow_control.prepared_claim

    def spy(shape, optimistic=False, *saves, **variant):
        kind = "credit" if variant.get("credit") else "optimistic" if optimistic else "serialized"
        runs.append(kind)
        return real(shape, optimistic, *saves, **variant)

    monkeypatch.setattr(flow_control, "prepared_claim", spy)
    return runs


def credits() -> dict[str, tuple[int, bool]]:
    """The queue's credits: holder -> (allowance, live in database time)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT holder, allowance, until > now() FROM pgqueue_flow_credit WHERE queue = 'lim'"
        )
        return {holder: (allowance, live) for holder, allowance, live in cursor.fetchall()}


@FAR_FROM_LIMITS
def test_an_optimistic_claim_far_from_every_limit_grants_a_credit_spent_at_once(monkeypatch):
    runs = spy_on_claims(monkeypatch)
    enqueue("a", 10)
    assert len(lease(1)) == 1  # serialized: creates the state and the shards
    before = FlowRateShard.objects.filter(queue="lim").order_by("shard")
    tokens = {s.shard: s.tokens for s in before}
    held = sum(s.held for s in before)
    assert len(lease(1)) == 1  # optimistic: grants a credit of 32 claims of 1
    assert runs == ["optimistic", "serialized", "optimistic"]
    (holder, (allowance, live)) = next(iter(credits().items()))
    assert allowance == flow_control.CREDIT_CLAIMS and live
    assert holder == flow_control.CREDITS.holder(connections["default"])
    # Spent in full by the grant: its ticket's tokens, and the kept count of leases.
    after = {s.shard: s for s in FlowRateShard.objects.filter(queue="lim")}
    spent = [tokens[n] - after[n].tokens for n in tokens if after[n].tokens < tokens[n]]
    assert len(spent) == 1 and spent[0] == pytest.approx(1 + allowance, abs=1.0)
    assert sum(s.held for s in after.values()) == held + 1 + allowance
    # The next claims run under the credit: nothing counted, no shard written.
    written = {n: (s.tokens, s.held) for n, s in after.items()}
    assert [len(lease(1)) for _ in range(3)] == [1, 1, 1]
    assert runs[3:] == ["credit"] * 3
    now = {s.shard: (s.tokens, s.held) for s in FlowRateShard.objects.filter(queue="lim")}
    assert now == written
    assert Message.objects.filter(queue="lim", lease_token__isnull=False).count() == 5


@FAR_FROM_LIMITS
def test_a_session_leases_no_more_than_its_allowance_under_a_credit(monkeypatch):
    monkeypatch.setattr(flow_control, "CREDIT_CLAIMS", 3)
    runs = spy_on_claims(monkeypatch)
    enqueue("a", 20)
    lease(1)  # serialized
    assert [len(lease(2)) for _ in range(5)] == [2] * 5
    # A grant of 3 x 2, three claims of 2 under it, then a grant again.
    assert runs[2:] == ["optimistic", "credit", "credit", "credit", "optimistic"]
    assert len(lease(2)) == 2 and len(lease(2)) == 2  # under the new credit: 2 left
    # A claim larger than what is left of the credit claims optimistically.
    assert len(lease(3)) == 3
    assert runs[-3:] == ["credit", "credit", "optimistic"]


def database_now() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        return cursor.fetchone()[0]


@FAR_FROM_LIMITS
def test_a_credit_ends_at_its_deadline_in_database_time(monkeypatch):
    runs = spy_on_claims(monkeypatch)
    enqueue("a", 10)
    lease(1)
    lease(1)  # grants
    credit = flow_control.CREDITS.usable(connections["default"], "lim", 1)
    assert credit is not None
    row = FlowCredit.objects.get(queue="lim")
    assert credit.until == pytest.approx(row.until.timestamp(), abs=1e-6)
    assert 0 < credit.until - database_now() <= flow_control.CREDIT_WINDOW
    # The database clock past the deadline (the host's hint still says it may be live).
    credit.until = database_now() - 0.001
    assert len(lease(1)) == 1  # served all the same
    # The claim under the ended credit took nothing; the optimistic one granted a new one.
    assert runs[3:] == ["credit", "optimistic"]
    assert [live for _, live in credits().values()] == [True]
    # The host clock's hint: past it the session does not even try its credit.
    monkeypatch.setattr(flow_control.CREDITS, "clock", lambda: time.monotonic() + 3600)
    lease(1)
    assert runs[-1] == "optimistic"


@FAR_FROM_LIMITS
def test_a_paused_queue_is_not_claimed_from_under_a_credit(monkeypatch):
    runs = spy_on_claims(monkeypatch)
    enqueue("a", 10)
    lease(1)
    lease(1)  # grants
    pause_queue("lim")
    assert lease(1) == []
    assert runs[-1] == "credit"
    resume_queue("lim")
    assert len(lease(1)) == 1 and runs[-1] == "credit"


@limits(CONCURRENCY_LIMIT=10_000, RATE_LIMIT=100_000)
def test_a_queue_without_fairness_is_claimed_in_its_plain_order_under_a_credit(monkeypatch):
    runs = spy_on_claims(monkeypatch)
    ids = enqueue(None, 6)
    leased = [m.id for _ in range(6) for m in lease(1)]
    assert leased == ids
    assert runs[2:] == ["optimistic"] + ["credit"] * 4
    # Nothing was given a place in a fair order.
    assert not Message.objects.filter(queue="lim", fair_order__gte=0).exists()


def grant_to_another_session(allowance: int, live: bool = True, holder: str = "other") -> None:
    until = Now() + dt.timedelta(seconds=60 if live else -1)
    FlowCredit.objects.create(queue="lim", holder=holder, allowance=allowance, until=until)


@limits(CONCURRENCY_LIMIT=5)
def test_every_claim_counts_the_live_credits_as_in_flight():
    enqueue(None, 10)
    lease(1)  # creates the state row
    grant_to_another_session(3)
    # 1 leased + 3 that the other session may still lease: 1 more fits.
    assert len(lease(5)) == 1
    FlowCredit.objects.filter(queue="lim").update(until=Now() - dt.timedelta(seconds=1))
    assert len(lease(5)) == 3  # the credit ended: its slots are free again


@limits(FAIRNESS=True, KEY_CONCURRENCY_LIMIT=4)
def test_a_credit_is_counted_against_every_key():
    """All of another session's allowance may go to one tenant: each key counts it."""
    enqueue("a", 10)
    enqueue("b", 10)
    lease(1)  # creates the state row ("a")
    grant_to_another_session(2)
    leased = lease(10)
    assert sorted(m.tenant for m in leased) == ["a", "b", "b"]  # 4 - 2 - 1 and 4 - 2


@limits(CONCURRENCY_LIMIT=5)
def test_a_serialized_count_keeps_the_live_credits_in_the_kept_count():
    enqueue(None, 10)
    lease(1)
    grant_to_another_session(3)
    grant_to_another_session(50, live=False, holder="ended")
    lease(1)  # serialized (5 - 1 < the margin): sets the kept count, the live credit in it
    assert sum(FlowRateShard.objects.filter(queue="lim").values_list("held", flat=True)) == 5


@FAR_FROM_LIMITS
def test_credits_of_sessions_long_gone_are_dropped(monkeypatch):
    enqueue("a", 10)
    lease(1)
    FlowCredit.objects.create(
        queue="lim", holder="gone", allowance=5, until=Now() - dt.timedelta(minutes=5)
    )
    lease(1)  # grants, and drops what is stale
    assert "gone" not in credits() and len(credits()) == 1


def test_no_credit_with_a_key_rate_nor_credits_switched_off(monkeypatch):
    FlowConfig = flow_control.FlowConfig
    assert flow_control.credit_size(FlowConfig(fairness=True, concurrency_limit=9), 2) == 64
    assert flow_control.credit_size(FlowConfig(fairness=True, key_rate_limit=5.0), 2) == 0
    assert flow_control.credit_size(FlowConfig(fairness=True), 2) == 0  # nothing to count
    monkeypatch.setattr(flow_control, "CREDIT_CLAIMS", 0)
    assert flow_control.credit_size(FlowConfig(fairness=True, concurrency_limit=9), 2) == 0


@limits(CONCURRENCY_LIMIT=60, KEY_CONCURRENCY_LIMIT=40, FAIRNESS=True, RATE_LIMIT=100_000)
def test_limits_hold_while_sessions_claim_under_credits_up_to_the_limit(monkeypatch):
    """6 claimers keep more and more leases each, up to 14 (84 > the queue limit of 60); with
    a margin of 2 x 2 they get credits while the queue is far from both limits, and claim
    under them up to where the counted claims take over. A heavy tenant ("a") reaches its key limit (40)
    once the light ones run out. The database's own counts after each claim never exceed a
    limit, and both limits are reached. (A long credit window: a loaded machine may not
    come back to claim within 0.2 s.)"""
    monkeypatch.setattr(flow_control, "OPTIMISTIC_CLAIMS", 2)
    monkeypatch.setattr(flow_control, "OPTIMISTIC_BATCH", 2)
    monkeypatch.setattr(flow_control, "CREDIT_WINDOW", 2.0)
    runs = spy_on_claims(monkeypatch)
    enqueue("a", 200)
    enqueue("b", 150)
    enqueue("c", 150)
    peaks = {"queue": 0, "key": 0}
    leased_ids: list[int] = []
    guard = threading.Lock()

    def claimer(n: int) -> None:
        held: list[Message] = []
        taken = 0
        while True:
            leased = lease(2, worker=f"w{n}")
            held.extend(leased)
            taken += len(leased)
            total, per_key = in_flight_now()
            with guard:
                peaks["queue"] = max(peaks["queue"], total)
                peaks["key"] = max(peaks["key"], per_key)
                leased_ids.extend(m.id for m in leased)
            # Holding more and more: far from the limits first (credits), then up to them.
            if len(held) > min(14, 2 + taken // 8) or (held and not leased):
                complete(held[:2])
                del held[:2]
            if not leased and not held:
                if not Message.objects.filter(queue="lim").exists():
                    return
                time.sleep(0.002)

    run_workers(6, claimer)
    assert len(leased_ids) == len(set(leased_ids)) == 500
    assert peaks["queue"] <= 60 and peaks["key"] <= 40, peaks
    assert peaks["queue"] >= 54 and peaks["key"] >= 36, peaks  # both limits reached
    kinds = Counter(runs)
    assert kinds["credit"] >= 10 and kinds["serialized"] > 0, kinds


@FAR_FROM_LIMITS
def test_a_claim_that_ends_the_sessions_credit_forgets_it(monkeypatch):
    """An optimistic claim that grants nothing ends the session's credit in the database (its
    own claims no longer count it): the session must never claim under it again."""
    runs = spy_on_claims(monkeypatch)
    enqueue("a", 10)
    lease(1)
    lease(1)  # grants
    monkeypatch.setattr(flow_control, "CREDIT_CLAIMS", 0)  # e.g. the settings changed
    lease(1)
    assert runs[-1] == "optimistic" and credits() == {}
    monkeypatch.setattr(flow_control, "CREDIT_CLAIMS", 32)
    lease(1)
    assert runs[-1] == "optimistic"  # not under the credit it ended: a new grant
    assert [allowance for allowance, _ in credits().values()] == [32]


@limits(FAIRNESS=True, CONCURRENCY_LIMIT=1_000)
def test_an_allowance_is_whole_batches_of_the_claim_that_got_it(monkeypatch):
    """A ticket's share of the room (1,000 - 400 margin - 1 in flight - 3 batch = 596, / 4 =
    149) in whole batches of 3: 147, so that nothing is held that claims of 3 cannot lease."""
    monkeypatch.setattr(flow_control, "CREDIT_CLAIMS", 100)  # up to 300: the room binds
    enqueue("a", 10)
    lease(1)  # serialized: 1 in flight
    assert len(lease(3)) == 3  # optimistic: grants
    assert [allowance for allowance, _ in credits().values()] == [147]
