"""A claimer's bounds (core/_claim_bound.py): its claims walk each priority level of the claim
index from a lower bound on ``available_at``, and a message that becomes due below its bound,
or at a level the claimer does not know, is still claimed, by the walk from the head that
follows within HEAD_WALK_EVERY seconds."""

import datetime as dt
import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.test import override_settings

import django_pgqueue
from django_pgqueue.core import _claim, _claim_sql, transitions
from django_pgqueue.core._claim import levels_params
from django_pgqueue.core._claim_bound import MAX_LEVELS, SLACK, ClaimBounds
from django_pgqueue.models import Message
from tests.bounds import bounded, claim, committed_late, db_now, until_the_head_walk_is_due
from tests.conftest import connection_kwargs
from tests.plans import buffers, explain_prepared, nodes, unbounded_reads

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_message_run_after_a_time_before_the_bound_is_claimed_all_the_same():
    bounds = bounded(ClaimBounds(slow_head_walk=0.0))
    old = django_pgqueue.enqueue(
        "t", {"n": 1}, priority=10, run_after=db_now() - dt.timedelta(hours=1)
    ).id
    assert claim(bounds) == []  # the walk from the bound passes it over...
    until_the_head_walk_is_due(bounds)
    assert claim(bounds) == [old]  # ...the next walk from the head takes it


def test_a_message_enqueued_before_the_bound_and_committed_after_it_is_claimed():
    with committed_late(lambda: [django_pgqueue.enqueue("t", {"n": "late"}).id]) as late:
        time.sleep(SLACK + 0.2)  # its available_at falls below the bound the next claim sets
        bounds = bounded(ClaimBounds(slow_head_walk=0.0))
    assert claim(bounds) == []
    until_the_head_walk_is_due(bounds)
    assert claim(bounds) == late


def test_a_bounded_claim_takes_what_is_due_above_the_bounds_in_claim_order():
    bounds = bounded(ClaimBounds(slow_head_walk=0.0))
    first_high = django_pgqueue.enqueue("t", {"n": 1}, priority=5).id
    until_the_head_walk_is_due(bounds)
    assert claim(bounds) == [first_high]  # from the head: the claimer learns priority 5
    low = django_pgqueue.enqueue("t", {"n": 2}).id
    high = django_pgqueue.enqueue("t", {"n": 3}, priority=5).id
    scheduled = django_pgqueue.enqueue("t", {"n": 4}, run_after=dt.timedelta(hours=1)).id
    assert [priority for priority, _, _ in bounds.start("default")] == [5, 0]
    assert claim(bounds) == [high, low]
    assert Message.objects.get(pk=scheduled).lease_token is None


def test_a_message_at_a_priority_no_claim_took_yet_waits_for_the_walk_from_the_head():
    bounds = bounded(ClaimBounds(slow_head_walk=0.0))
    new_level = django_pgqueue.enqueue("t", {"n": 1}, priority=-3).id
    assert claim(bounds) == []  # the walks from the bounds know only priority 0...
    until_the_head_walk_is_due(bounds)
    assert claim(bounds) == [new_level]  # ...the next walk from the head takes it


def test_a_full_batch_moves_the_bound_of_its_last_level_to_its_last_message():
    bounds = ClaimBounds(slow_head_walk=0.0)
    bounds.walked_from_head("q", 1.0)
    bounds.claimed("q", [(5, 100.0, 0), (0, 40.0, 0), (0, 50.0, 0)], 200.0, full=True, began=0.0)
    # Priority 5 was walked to its end; priority 0 up to the last message taken.
    assert bounds.start("q") == [(5, 200.0 - SLACK, 0), (0, 50.0 - SLACK, 0)]
    bounds.claimed("q", [(0, 60.0, 0)], 210.0, full=True, began=0.0)  # priority 5 had nothing left
    assert bounds.start("q") == [(5, 210.0 - SLACK, 0), (0, 60.0 - SLACK, 0)]
    bounds.claimed("q", [(0, 70.0, 0)], 220.0, full=False, began=0.0)  # drained: every level walked
    assert bounds.start("q") == [(5, 220.0 - SLACK, 0), (0, 220.0 - SLACK, 0)]
    bounds.claimed("q", [(0, 10.0, 0)], 230.0, full=True, began=0.0)  # a bound never moves down
    assert bounds.start("q") == [(5, 230.0 - SLACK, 0), (0, 220.0 - SLACK, 0)]


def test_a_queue_with_more_levels_than_the_bounds_keep_is_walked_from_the_head():
    bounds = ClaimBounds(slow_head_walk=0.0)
    bounds.walked_from_head("q", 1.0)
    bounds.claimed("q", [(p, 1.0, 0) for p in range(MAX_LEVELS)], 2.0, full=False, began=0.0)
    assert len(bounds.start("q")) == MAX_LEVELS
    bounds.claimed("q", [(-1, 1.0, 0)], 3.0, full=False, began=0.0)
    assert bounds.start("q") is None


def test_the_bound_is_used_only_while_walks_from_the_head_are_slow():
    # Without a long transaction the walk from the head marks the dead entries it passes,
    # and stays cheap: a walk from a bound, which does not, would let them pile up.
    bounds = ClaimBounds(slow_head_walk=0.5)
    first = django_pgqueue.enqueue("t", {"n": 0}).id
    assert claim(bounds) == [first]  # fast: well under half a second
    assert bounds.start("default") is None
    bounds.walked_from_head("default", 0.6)  # as a walk over many dead entries would
    assert bounds.start("default") is not None
    bounds.walked_from_head("default", 0.1)  # clean again
    assert bounds.start("default") is None


def test_without_bounds_every_claim_walks_from_the_head():
    django_pgqueue.enqueue("t", {"n": 0})
    Message.objects.lease("default", worker_id="w1", batch_size=10)
    old = django_pgqueue.enqueue("t", {"n": 1}, run_after=db_now() - dt.timedelta(hours=1)).id
    assert [m.id for m in Message.objects.lease("default", worker_id="w1")] == [old]


def test_a_bounded_claim_checks_the_bound_on_the_claim_index(admin_conn):
    """The entries below the bound are passed over on the index alone: the bound is an
    index condition of the claim index in the claim's own (generic, prepared) plan."""
    from django_pgqueue.core import _execution

    _execution.dedicate_to_claims(connection)
    try:
        bounds = bounded(ClaimBounds(slow_head_walk=0.0))
        admin_conn.execute(
            "INSERT INTO pgqueue_message (queue, task, payload) "
            "SELECT 'default', 't', '{}' FROM generate_series(1, 5000)"
        )
        admin_conn.execute("ANALYZE pgqueue_message")
        assert len(claim(bounds)) == 10  # prepares the claim from the bound
        priorities, floors, _ = levels_params(bounds.start("default"))
        named = {"queue": "default", "batch": 10, "worker": "w1", "visibility_timeout": 30.0}
        named.update(levels=priorities, bounds=floors)
        with connection.cursor() as cursor:
            [plan] = explain_prepared(cursor, _claim_sql.BOUNDED_CLAIM, named, {}).values()
        assert unbounded_reads(plan) == [], plan
        [walk] = [n for n in nodes(plan) if n.get("Index Name") == "pgq_message_claim"]
        assert "priority =" in walk["Index Cond"], walk
        assert "available_at >=" in walk["Index Cond"], walk
        # The levels' walks are read as far as the batch needs, never sorted as a whole.
        sorts = [n for n in nodes(plan) if n["Node Type"] == "Sort"]
        assert all("available_at" not in str(n["Sort Key"]) for n in sorts), plan
    finally:
        _execution.end_dedicated_session(connection)


@pytest.mark.parametrize("from_bounds", [False, True])
def test_a_claim_planned_on_an_empty_queue_reads_its_batch_by_primary_key_once(
    admin_conn, from_bounds
):
    """A generic plan cannot know the batch size (a parameter) and may guess it at one row.
    Whatever it guesses, the lease reads the batch's rows in one scan of the primary key,
    not once per claimed row (O(batch²) index lookups)."""
    from django_pgqueue.core import _execution

    _execution.dedicate_to_claims(connection)
    try:
        bounds = bounded(ClaimBounds(slow_head_walk=0.0)) if from_bounds else None
        assert _claim.lease("default", worker_id="w1", bounds=bounds) == []  # planned empty
        admin_conn.execute(
            "INSERT INTO pgqueue_message (queue, task, payload) "
            "SELECT 'default', 't', '{}' FROM generate_series(1, 2000)"
        )
        named: dict[str, Any] = {
            "queue": "default",
            "batch": 500,
            "worker": "w1",
            "visibility_timeout": 30.0,
        }
        statement = _claim_sql.PLAIN_CLAIM
        if bounds is not None:
            statement = _claim_sql.BOUNDED_CLAIM
            priorities, floors, _ = levels_params(bounds.start("default"))
            named.update(levels=priorities, bounds=floors)
        with connection.cursor() as cursor:
            [plan] = explain_prepared(cursor, statement, named, {}, analyze=True).values()
        by_id = [n for n in nodes(plan) if n.get("Index Name") == "pgqueue_message_pkey"]
        claimed = [n for n in by_id if "ANY" in n.get("Index Cond", "")]
        assert claimed and all(n["Actual Loops"] == 1 for n in claimed), plan
        assert Message.objects.filter(lease_token__isnull=False).count() == 500 + bool(bounds)
    finally:
        _execution.end_dedicated_session(connection)


def test_a_look_from_the_head_lowers_the_bounds_to_what_fell_due_below_them():
    # Claims that never walk from the head themselves: the look does it for them.
    bounds = bounded(ClaimBounds(slow_head_walk=0.0, head_walks_in_claims=False))
    old = django_pgqueue.enqueue("t", {"n": 1}, run_after=db_now() - dt.timedelta(hours=1)).id
    other_level = django_pgqueue.enqueue("t", {"n": 2}, priority=-3).id
    assert claim(bounds) == []  # below the bound, and at a level not known
    _claim.look_from_head("default", bounds, alias="default")
    assert claim(bounds) == [old, other_level]
    assert bounds.start("default") is not None  # still walking from the bounds


def test_a_claim_under_way_when_a_look_lowers_a_bound_does_not_raise_it_again():
    bounds = ClaimBounds(slow_head_walk=0.0, head_walks_in_claims=False)
    bounds.walked_from_head("q", 1.0)
    bounds.claimed("q", [(0, 100.0, 0)], 200.0, full=False, began=time.monotonic())
    began = time.monotonic()  # a claim starts from 199.5...
    bounds.seen_from_head("q", [(0, 150.0, 0)])  # ...a look finds a message due at 150...
    bounds.claimed("q", [(0, 199.6, 0)], 210.0, full=False, began=began)  # ...the claim ends
    assert bounds.start("q") == [(0, 150.0, 0)]
    bounds.claimed("q", [(0, 150.0, 0)], 211.0, full=False, began=time.monotonic())
    assert bounds.start("q") == [(0, 211.0 - SLACK, 0)]


def test_the_look_from_the_head_reads_the_claim_index_in_claim_order(admin_conn):
    admin_conn.execute(
        "INSERT INTO pgqueue_message (queue, task, payload) "
        "SELECT 'default', 't', '{}' FROM generate_series(1, 5000)"
    )
    admin_conn.execute("ANALYZE pgqueue_message")
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + _claim_sql.HEAD_OF_QUEUE, {"queue": "default", "rows": 100}
        )
        [plan] = cursor.fetchone()
    assert unbounded_reads(plan) == [], plan
    assert not [n for n in nodes(plan) if n["Node Type"] == "Sort"], plan


# A fair queue's claims walk its fair order from their bounds: places in that order.

FAIR = {"QUEUES": {"fair": {"FAIRNESS": True}}}


def fair_claim(bounds: ClaimBounds, n: int = 4) -> list[Message]:
    return _claim.lease("fair", worker_id="w1", batch_size=n, bounds=bounds)


def places(bounds: ClaimBounds) -> list[tuple[int, float]]:
    """The fair queue's levels and their bounds' places."""
    return [(priority, place) for priority, place, _ in bounds.start("fair", fair=True) or []]


def enqueue_fair(tenant: str, count: int) -> list[int]:
    return [
        django_pgqueue.enqueue("t", {"n": n}, queue="fair", tenant=tenant).id for n in range(count)
    ]


def test_a_fair_bound_is_the_first_place_and_id_a_full_batch_took_in_its_last_level():
    bounds = ClaimBounds(head_walks_in_claims=False)
    assert bounds.start("f", fair=True) is None
    taken = [(5, 3.0, 40), (0, 7.0, 12), (0, 7.0, 30), (0, 8.0, 2)]
    bounds.claimed("f", taken, 100.0, full=True, began=0.0)
    # Priority 5 was walked to its end: its next message may enter at place 0.
    assert bounds.start("f", fair=True) == [(5, float("-inf"), 0), (0, 7.0, 12)]
    bounds.claimed("f", [(0, 9.0, 5)], 101.0, full=True, began=0.0)
    assert bounds.start("f", fair=True) == [(5, float("-inf"), 0), (0, 9.0, 5)]
    bounds.claimed("f", [], 102.0, full=False, began=0.0)  # drained
    assert bounds.start("f", fair=True) == [(5, float("-inf"), 0), (0, float("-inf"), 0)]


@override_settings(PGQUEUE=FAIR)
def test_a_fair_claim_walks_from_the_first_place_its_last_batch_took():
    bounds = ClaimBounds(head_walks_in_claims=False)
    for tenant in "abc":
        enqueue_fair(tenant, 5)  # places 0 to 4 for each tenant
    assert bounds.start("fair", fair=True) is None  # nothing known yet: from the head
    assert [m.tenant for m in fair_claim(bounds)] == ["a", "b", "c", "a"]  # places 0, 0, 0, 1
    assert places(bounds) == [(0, 0.0)]
    assert [m.tenant for m in fair_claim(bounds)] == ["b", "c", "a", "b"]  # places 1, 1, 2, 2
    assert places(bounds) == [(0, 1.0)]
    assert bounds.bounded_queues() == ["fair"]  # fair: from the bounds, fast head or not


@override_settings(PGQUEUE=FAIR)
def test_a_drained_fair_order_is_walked_from_its_head_again():
    bounds = ClaimBounds(head_walks_in_claims=False)
    enqueue_fair("a", 8)
    assert len(fair_claim(bounds)) == 4
    assert len(fair_claim(bounds)) == 4
    assert places(bounds) == [(0, 4.0)]
    assert fair_claim(bounds) == []  # drained: the next message enters at place 0
    [new] = enqueue_fair("b", 1)
    assert Message.objects.get(pk=new).fair_order == 0
    assert [m.id for m in fair_claim(bounds)] == [new]


@override_settings(PGQUEUE=FAIR)
def test_a_fair_message_enqueued_in_a_late_transaction_is_claimed_after_a_look_at_the_head():
    bounds = ClaimBounds(head_walks_in_claims=False)
    enqueue_fair("a", 20)
    # At the head of the order: place 0.
    with committed_late(lambda: enqueue_fair("late", 1)) as late:
        for _ in range(3):
            assert len(fair_claim(bounds)) == 4
    assert places(bounds) == [(0, 8.0)]
    assert late[0] not in {m.id for m in fair_claim(bounds)}  # below the bound
    _claim.look_from_head("fair", bounds, alias="default")
    assert places(bounds) == [(0, 0.0)]
    assert fair_claim(bounds)[0].id == late[0]  # first in fair order


@override_settings(PGQUEUE=FAIR)
def test_a_fair_claim_rolled_back_below_the_bounds_is_claimed_after_a_look_at_the_head():
    bounds = ClaimBounds(head_walks_in_claims=False)
    enqueue_fair("a", 20)
    assert len(fair_claim(bounds)) == 4
    with transaction.atomic():
        held = Message.objects.lease("fair", worker_id="w2", batch_size=4, hold=True)
        assert len(fair_claim_elsewhere(bounds)) == 4  # another connection's claim meanwhile
        transaction.set_rollback(True)
    assert [m.fair_order for m in Message.objects.filter(pk__in=[m.id for m in held])] == [
        4.0,
        5.0,
        6.0,
        7.0,
    ]
    assert {m.id for m in fair_claim(bounds)}.isdisjoint(m.id for m in held)
    _claim.look_from_head("fair", bounds, alias="default")
    assert [m.id for m in fair_claim(bounds)] == [m.id for m in held]


def fair_claim_elsewhere(bounds: ClaimBounds) -> list[Message]:
    """A claim with ``bounds`` on a connection of its own (in a thread)."""
    result: list[Message] = []

    def run() -> None:
        try:
            result.extend(fair_claim(bounds))
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return result


@override_settings(PGQUEUE={"QUEUES": {"fair": {"FAIRNESS": True, "KEY_CONCURRENCY_LIMIT": 1}}})
def test_a_fair_queue_whose_claims_pass_over_tenants_is_walked_from_its_head():
    bounds = ClaimBounds(head_walks_in_claims=False)
    enqueue_fair("a", 5)
    enqueue_fair("b", 5)
    assert [m.tenant for m in fair_claim(bounds)] == ["a", "b"]
    assert bounds.bounded_queues() == []  # the claim neither used nor kept bounds


@override_settings(PGQUEUE=FAIR)
def test_a_fair_claim_from_its_bound_passes_over_the_dead_entries_below_it(admin_conn):
    """With a snapshot held open, every claimed message leaves a dead entry at the head of
    the fair order that vacuum cannot remove: the walk from the head reads more of them the
    more messages are processed, the walk from the bound only what is above it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_message (queue, task, payload, tenant, fair_order) "
            "SELECT 'fair', 't', '{}', 't' || (g % 100), g / 100 "
            "FROM generate_series(0, 9999) g"
        )
    admin_conn.execute("ANALYZE pgqueue_message")
    bounds = ClaimBounds(head_walks_in_claims=False)
    walks: list[tuple[int, int]] = []
    with psycopg.connect(**connection_kwargs()) as snapshot:
        snapshot.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        snapshot.execute("SELECT count(*) FROM pgqueue_message").fetchone()
        for _ in range(2):
            for _ in range(40):
                batch = fair_claim(bounds, 100)
                assert len(batch) == 100
                transitions.complete(batch)
            levels = levels_params(bounds.start("fair", fair=True))
            walks.append(
                (
                    _head_walk_buffers(admin_conn, ("{}", "{}", "{}")),
                    _head_walk_buffers(admin_conn, levels),
                )
            )
        snapshot.rollback()
    [(head_4000, bound_4000), (head_8000, bound_8000)] = walks
    # 4,000 more dead entries: some 80 more pages read from the head, none from the bound.
    assert head_8000 - head_4000 > 50, walks
    assert bound_8000 <= bound_4000 + 5 and bound_8000 < head_8000, walks


def _head_walk_buffers(conn: psycopg.Connection[Any], levels: tuple[str, str, str]) -> int:
    """Buffers of one walk of the fair order (``pgq_flow_head``, 100 messages), its locks
    rolled back; the second of two, so that the function's planning is not counted."""
    walks = []
    for _ in range(2):
        with conn.transaction(force_rollback=True):
            [plan] = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                "SELECT * FROM pgq_flow_head('fair', 100, %s::int2[], %s::float8[], %s::int8[])",
                list(levels),
            ).fetchone()[0]
        walks.append(buffers(plan))
    return walks[-1]
