"""A claimer's bounds (core/_claim_bound.py): its claims walk each priority level of the claim
index from a lower bound on ``available_at``, and a message that becomes due below its bound,
or at a level the claimer does not know, is still claimed, by the walk from the head that
follows within HEAD_WALK_EVERY seconds."""

import datetime as dt
import threading
import time

import pytest
from django.db import connection, transaction

import django_pgqueue
from django_pgqueue.core import _sql
from django_pgqueue.core._claim_bound import HEAD_WALK_EVERY, MAX_LEVELS, SLACK, ClaimBounds
from django_pgqueue.models import Message
from tests.bounds import bounded, claim, db_now
from tests.plans import explain_prepared, nodes, unbounded_reads

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_message_run_after_a_time_before_the_bound_is_claimed_all_the_same():
    bounds = bounded(ClaimBounds(slow_head_walk=0.0))
    old = django_pgqueue.enqueue(
        "t", {"n": 1}, priority=10, run_after=db_now() - dt.timedelta(hours=1)
    ).id
    assert claim(bounds) == []  # the walk from the bound passes it over...
    time.sleep(HEAD_WALK_EVERY)
    assert claim(bounds) == [old]  # ...the next walk from the head takes it


def test_a_message_enqueued_before_the_bound_and_committed_after_it_is_claimed():
    enqueued, committed, go = threading.Event(), threading.Event(), threading.Event()
    late: list[int] = []

    def enqueue_in_a_long_transaction() -> None:
        try:
            with transaction.atomic():
                late.append(django_pgqueue.enqueue("t", {"n": "late"}).id)
                enqueued.set()
                go.wait(30)
        finally:
            connection.close()
            committed.set()

    writer = threading.Thread(target=enqueue_in_a_long_transaction)
    writer.start()
    assert enqueued.wait(30)
    time.sleep(SLACK + 0.2)  # its available_at falls below the bound the next claim sets
    bounds = bounded(ClaimBounds(slow_head_walk=0.0))
    go.set()
    assert committed.wait(30)
    writer.join()
    assert claim(bounds) == []
    time.sleep(HEAD_WALK_EVERY)
    assert claim(bounds) == late


def test_a_bounded_claim_takes_what_is_due_above_the_bounds_in_claim_order():
    bounds = bounded(ClaimBounds(slow_head_walk=0.0))
    first_high = django_pgqueue.enqueue("t", {"n": 1}, priority=5).id
    time.sleep(HEAD_WALK_EVERY)
    assert claim(bounds) == [first_high]  # from the head: the claimer learns priority 5
    low = django_pgqueue.enqueue("t", {"n": 2}).id
    high = django_pgqueue.enqueue("t", {"n": 3}, priority=5).id
    scheduled = django_pgqueue.enqueue("t", {"n": 4}, run_after=dt.timedelta(hours=1)).id
    assert [priority for priority, _ in bounds.start("default")] == [5, 0]
    assert claim(bounds) == [high, low]
    assert Message.objects.get(pk=scheduled).lease_token is None


def test_a_message_at_a_priority_no_claim_took_yet_waits_for_the_walk_from_the_head():
    bounds = bounded(ClaimBounds(slow_head_walk=0.0))
    new_level = django_pgqueue.enqueue("t", {"n": 1}, priority=-3).id
    assert claim(bounds) == []  # the walks from the bounds know only priority 0...
    time.sleep(HEAD_WALK_EVERY)
    assert claim(bounds) == [new_level]  # ...the next walk from the head takes it


def test_a_full_batch_moves_the_bound_of_its_last_level_to_its_last_message():
    bounds = ClaimBounds(slow_head_walk=0.0)
    bounds.walked_from_head("q", 1.0)
    bounds.claimed("q", [(5, 100.0), (0, 40.0), (0, 50.0)], 200.0, full=True, began=0.0)
    # Priority 5 was walked to its end; priority 0 up to the last message taken.
    assert bounds.start("q") == [(5, 200.0 - SLACK), (0, 50.0 - SLACK)]
    bounds.claimed("q", [(0, 60.0)], 210.0, full=True, began=0.0)  # priority 5 had nothing left
    assert bounds.start("q") == [(5, 210.0 - SLACK), (0, 60.0 - SLACK)]
    bounds.claimed("q", [(0, 70.0)], 220.0, full=False, began=0.0)  # drained: every level walked
    assert bounds.start("q") == [(5, 220.0 - SLACK), (0, 220.0 - SLACK)]
    bounds.claimed("q", [(0, 10.0)], 230.0, full=True, began=0.0)  # a bound never moves down
    assert bounds.start("q") == [(5, 230.0 - SLACK), (0, 220.0 - SLACK)]


def test_a_queue_with_more_levels_than_the_bounds_keep_is_walked_from_the_head():
    bounds = ClaimBounds(slow_head_walk=0.0)
    bounds.walked_from_head("q", 1.0)
    bounds.claimed("q", [(p, 1.0) for p in range(MAX_LEVELS)], 2.0, full=False, began=0.0)
    assert len(bounds.start("q")) == MAX_LEVELS
    bounds.claimed("q", [(-1, 1.0)], 3.0, full=False, began=0.0)
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
    from django_pgqueue.core import _execution, _prepared
    from django_pgqueue.core._manager import _levels_params

    _execution.dedicate_to_claims(connection)
    try:
        bounds = bounded(ClaimBounds(slow_head_walk=0.0))
        admin_conn.execute(
            "INSERT INTO pgqueue_message (queue, task, payload) "
            "SELECT 'default', 't', '{}' FROM generate_series(1, 5000)"
        )
        admin_conn.execute("ANALYZE pgqueue_message")
        assert len(claim(bounds)) == 10  # prepares the claim from the bound
        statement = Message.objects._bounded_lease_statement(10)
        levels = _levels_params(bounds.start("default"))
        params = ["default", *levels, "default", "default", "w1", 30.0]
        name, _ = _prepared.prepared_form("claim", statement, tuple(map(_type, params)))
        with connection.cursor() as cursor:
            [plan] = explain_prepared(cursor, name, params, {}).values()
        assert unbounded_reads(plan) == [], plan
        [walk] = [n for n in nodes(plan) if n.get("Index Name") == "pgq_message_claim"]
        assert "priority =" in walk["Index Cond"], walk
        assert "available_at >=" in walk["Index Cond"], walk
        # The levels' walks are read as far as the batch needs, never sorted as a whole.
        sorts = [n for n in nodes(plan) if n["Node Type"] == "Sort"]
        assert all("available_at" not in str(n["Sort Key"]) for n in sorts), plan
    finally:
        _execution.end_claim_session(connection)


def _type(value: object) -> str:
    return "float8" if isinstance(value, float) else "text"


def test_a_look_from_the_head_lowers_the_bounds_to_what_fell_due_below_them():
    # Claims that never walk from the head themselves: the look does it for them.
    bounds = bounded(ClaimBounds(slow_head_walk=0.0, head_walks_in_claims=False))
    old = django_pgqueue.enqueue("t", {"n": 1}, run_after=db_now() - dt.timedelta(hours=1)).id
    other_level = django_pgqueue.enqueue("t", {"n": 2}, priority=-3).id
    assert claim(bounds) == []  # below the bound, and at a level not known
    Message.objects.look_from_head("default", bounds)
    assert claim(bounds) == [old, other_level]
    assert bounds.start("default") is not None  # still walking from the bounds


def test_a_claim_under_way_when_a_look_lowers_a_bound_does_not_raise_it_again():
    bounds = ClaimBounds(slow_head_walk=0.0, head_walks_in_claims=False)
    bounds.walked_from_head("q", 1.0)
    bounds.claimed("q", [(0, 100.0)], 200.0, full=False, began=time.monotonic())
    began = time.monotonic()  # a claim starts from 199.5...
    bounds.seen_from_head("q", [(0, 150.0)])  # ...a look finds a message due at 150...
    bounds.claimed("q", [(0, 199.6)], 210.0, full=False, began=began)  # ...the claim ends
    assert bounds.start("q") == [(0, 150.0)]
    bounds.claimed("q", [(0, 150.0)], 211.0, full=False, began=time.monotonic())
    assert bounds.start("q") == [(0, 211.0 - SLACK)]


def test_the_look_from_the_head_reads_the_claim_index_in_claim_order(admin_conn):
    admin_conn.execute(
        "INSERT INTO pgqueue_message (queue, task, payload) "
        "SELECT 'default', 't', '{}' FROM generate_series(1, 5000)"
    )
    admin_conn.execute("ANALYZE pgqueue_message")
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + _sql.HEAD_OF_QUEUE, ["default", 100])
        [plan] = cursor.fetchone()
    assert unbounded_reads(plan) == [], plan
    assert not [n for n in nodes(plan) if n["Node Type"] == "Sort"], plan
