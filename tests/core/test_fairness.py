"""Tenant fairness in the claim: weighted fair queuing over tenants, served by an index."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

import django_pgqueue
from django_pgqueue.core import _claim, _claim_sql, _flow_control, _sql, transitions
from django_pgqueue.core._claim_bound import ClaimBounds
from django_pgqueue.core.operations import pause_queue, resume_queue
from django_pgqueue.models import FlowAllowance, FlowRate, Message
from tests.plans import buffers, explain_prepared, nested_plans, unbounded_reads

pytestmark = pytest.mark.django_db(transaction=True)

FAIR = {"BACKOFF_JITTER": 0.0, "QUEUES": {"fair": {"FAIRNESS": True}}}

# The claimer's bounds each test's claims keep (core/_claim_bound.py), or None: every test runs
# twice, its claims walking the fair order from the head, and from the bounds as a worker's do.
_bounds: ClaimBounds | None = None


@pytest.fixture(autouse=True, params=["from the head", "from bounds"])
def claimer(request: pytest.FixtureRequest) -> Iterator[None]:
    global _bounds
    _bounds = ClaimBounds() if request.param == "from bounds" else None
    yield
    _bounds = None


def lease(n: int = 1, queue: str = "fair", worker: str = "w1") -> list[Message]:
    return _claim.lease(queue, worker_id=worker, batch_size=n, bounds=_bounds)


def enqueue_many(tenant: str | None, count: int, queue: str = "fair", **kwargs) -> list[int]:
    return [
        django_pgqueue.enqueue(
            "t", {"tenant": tenant, "n": n}, queue=queue, tenant=tenant, **kwargs
        ).id
        for n in range(count)
    ]


def bulk(tenant: str, count: int, queue: str = "fair", **kwargs) -> int:
    """Many messages of one tenant in one statement, through ``enqueue_many``."""
    return django_pgqueue.enqueue_many(
        "t", ({"n": n} for n in range(count)), queue=queue, tenant=tenant, **kwargs
    )


def raw_bulk(tenant: str, count: int, queue: str = "fair") -> None:
    """Many messages written by raw SQL: no place in the fair order (``fair_order`` NULL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_message (queue, task, payload, tenant) "
            "SELECT %s, 't', jsonb_build_object('n', g), %s FROM generate_series(1, %s) g",
            [queue, tenant, count],
        )


@override_settings(PGQUEUE=FAIR)
def test_a_heavy_tenant_does_not_starve_light_ones():
    assert bulk("heavy", 1000) == 1000
    light = enqueue_many("light-a", 3) + enqueue_many("light-b", 3)
    leased = [m for _ in range(6) for m in lease(2)]
    # Six claims of two: every light message is out while the heavy tenant got its equal share.
    assert set(light) <= {m.id for m in leased}
    assert Counter(m.tenant for m in leased) == {"heavy": 6, "light-a": 3, "light-b": 3}


def test_without_fairness_the_same_backlog_is_fifo():
    bulk("heavy", 1000, queue="plain")
    enqueue_many("light", 3, queue="plain")
    leased = lease(10, queue="plain")
    assert {m.tenant for m in leased} == {"heavy"}


@override_settings(PGQUEUE=FAIR)
def test_round_robin_visits_tenants_in_turn_across_claims():
    for tenant in ("a", "b", "c"):
        enqueue_many(tenant, 3)
    order = [m.tenant for _ in range(9) for m in lease(1)]
    assert order == ["a", "b", "c"] * 3


@override_settings(PGQUEUE=FAIR)
def test_within_a_tenant_priority_then_age():
    low = enqueue_many("a", 2)
    high = enqueue_many("a", 1, priority=5)
    assert [m.id for m in lease(3)] == high + low


@override_settings(PGQUEUE={"QUEUES": {"fair": {"FAIRNESS": True, "TENANT_WEIGHTS": {"gold": 3}}}})
def test_weights_give_a_tenant_that_many_messages_per_turn_even_one_claim_at_a_time():
    enqueue_many("gold", 12)
    enqueue_many("iron", 12)
    singles = [m.tenant for _ in range(8) for m in lease(1)]
    # Every four claims in a row: three for gold, one for iron.
    assert Counter(singles[:4]) == Counter(singles[4:]) == {"gold": 3, "iron": 1}
    batch = Counter(m.tenant for m in lease(8))
    assert batch == {"gold": 6, "iron": 2}


ODD_TENANT = "o'gold %(queue)s %s%%"


@pytest.mark.parametrize("claim_session", [False, True], ids=["cursor", "claim-session"])
@override_settings(
    PGQUEUE={"QUEUES": {"fair": {"FAIRNESS": True, "KEY_CONCURRENCY_LIMITS": {ODD_TENANT: 1}}}}
)
def test_settings_naming_tenants_with_quotes_and_placeholders_reach_the_claim_intact(
    claim_session,
):
    """Settings are written into the claim statement as literals: quoted, with ``%`` and
    what looks like a placeholder left alone, on Django's cursor and on the driver alike."""
    from django_pgqueue.core import _execution

    enqueue_many(ODD_TENANT, 3)
    enqueue_many("iron", 3)
    if claim_session:
        _execution.dedicate_to_claims(connection)
    try:
        assert Counter(m.tenant for m in lease(4)) == {ODD_TENANT: 1, "iron": 3}
    finally:
        _execution.end_dedicated_session(connection)


@override_settings(PGQUEUE=FAIR)
def test_messages_without_a_tenant_are_one_more_group_in_the_rotation():
    enqueue_many("a", 5)
    enqueue_many("b", 5)
    untenanted = enqueue_many(None, 3)
    leased = [m for _ in range(5) for m in lease(3)]
    got = Counter(m.tenant for m in leased)
    assert got == {"a": 5, "b": 5, None: 3}
    # The untenanted group takes one message per rotation, not all at once.
    positions = [n for n, m in enumerate(leased) if m.id in untenanted]
    assert min(b - a for a, b in itertools.pairwise(positions)) >= 2


@override_settings(PGQUEUE=FAIR)
def test_dedup_keys_in_a_fair_queue_keep_one_message_and_its_place():
    first = django_pgqueue.enqueue("t", {}, queue="fair", tenant="x", dedup_key="k")
    again = django_pgqueue.enqueue("t", {}, queue="fair", tenant="x", dedup_key="k")
    assert again.deduplicated and again.id == first.id
    with transaction.atomic():
        second = django_pgqueue.enqueue("t", {}, queue="fair", tenant="x", dedup_key="k2")
    written = django_pgqueue.enqueue_many(
        "t", [{}, {}], queue="fair", tenant="y", dedup_keys=["k3", "k"]
    )
    assert written == 1
    places = dict(Message.objects.values_list("dedup_key", "fair_order"))
    # x's second message behind its first; y, with nothing waiting, at the head.
    assert places == {"k": 0.0, "k2": 1.0, "k3": 0.0}
    assert second.id in {m.id for m in lease(3)}


@override_settings(PGQUEUE=FAIR)
def test_scheduled_messages_are_skipped():
    enqueue_many("later", 2, run_after=dt.timedelta(hours=1))
    enqueue_many("now", 2)
    assert [m.tenant for m in lease(5)] == ["now", "now"]
    assert lease(5) == []


@override_settings(PGQUEUE=FAIR)
def test_messages_written_without_a_place_are_served_and_fairly():
    """Raw SQL, or rows from before fairness was switched on: found among the oldest."""
    raw_bulk("heavy", 300)
    light = enqueue_many("light", 3)
    leased = [m for _ in range(4) for m in lease(2)]
    assert set(light) <= {m.id for m in leased}
    assert len(leased) == 8
    while more := lease(50):
        leased += more
    assert len({m.id for m in leased}) == 303


@override_settings(PGQUEUE=FAIR)
def test_scheduled_messages_falling_due_together_take_their_turn():
    """A heavy tenant's scheduled backlog, all due at once, queues behind itself."""
    bulk("heavy", 300, run_after=dt.timedelta(hours=1))
    assert lease(5) == []
    Message.objects.filter(queue="fair").update(available_at=dt.datetime.now(dt.UTC))
    light = enqueue_many("light", 3)
    leased = [m for _ in range(3) for m in lease(2)]
    assert set(light) <= {m.id for m in leased}


@override_settings(PGQUEUE=FAIR)
def test_a_retry_goes_behind_its_own_tenants_waiting_messages():
    [first, *rest] = enqueue_many("a", 3, max_attempts=3)
    enqueue_many("b", 3)
    [m] = lease(1)
    assert m.id == first
    transitions.fail([transitions.FailedAttempt(m, {"type": "E", "message": "x"}, retry_in=0)])
    order = [(m.tenant, m.id) for _ in range(6) for m in lease(1)]
    assert [tenant for tenant, _ in order] == ["b", "a", "b", "a", "b", "a"]
    assert [i for tenant, i in order if tenant == "a"] == [*rest, first]


def test_switching_fairness_off_leaves_no_message_behind():
    with override_settings(PGQUEUE=FAIR):
        enqueue_many("a", 3)
        enqueue_many("b", 2, run_after=dt.timedelta(hours=1))
    assert len(lease(10)) == 3
    Message.objects.filter(tenant="b").update(available_at=dt.datetime.now(dt.UTC))
    assert len(lease(10)) == 2


@override_settings(PGQUEUE=FAIR)
def test_scheduled_backlogs_do_not_hide_a_ready_message():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_message (queue, task, tenant, available_at) "
            "SELECT 'fair', 't', 'idle-' || lpad(g::text, 4, '0'), now() + interval '1 hour' "
            "FROM generate_series(1, 200) g"
        )
    target = enqueue_many("zz-ready", 1)
    leased: list[Message] = []
    for _ in range(10):
        leased += lease(1)
    assert [m.id for m in leased] == target


@override_settings(PGQUEUE=FAIR)
def test_expired_leases_are_redelivered_and_retries_come_back_in_turn():
    [first] = enqueue_many("a", 1, max_attempts=3)
    [m] = lease(1)
    transitions.fail([transitions.FailedAttempt(m, {"type": "E", "message": "x"}, retry_in=0)])
    [again] = lease(1)
    assert again.id == first and again.attempts == 2


@override_settings(PGQUEUE=FAIR)
def test_paused_fair_queue_is_not_claimed_from():
    enqueue_many("a", 2)
    pause_queue("fair")
    assert lease(5) == []
    resume_queue("fair")
    assert len(lease(5)) == 2


@override_settings(PGQUEUE=FAIR)
def test_fair_claims_run_side_by_side_without_taking_a_message_twice():
    """Fairness alone takes no lock: concurrent claims take disjoint heads (SKIP LOCKED)."""
    for tenant in ("a", "b", "c", "d"):
        enqueue_many(tenant, 40)
    taken: list[int] = []
    guard = threading.Lock()
    start = threading.Barrier(4)

    def claimer(n: int) -> None:
        try:
            start.wait()
            while batch := lease(3, worker=f"w{n}"):
                with guard:
                    taken.extend(m.id for m in batch)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(taken) == len(set(taken)) == 160
    assert not FlowAllowance.objects.exists()  # fairness alone counts nothing


@override_settings(PGQUEUE=FAIR)
def test_a_claim_session_claims_a_fair_queue_with_bind_execute(monkeypatch):
    """On a worker's claim session a fair claim is a bare Bind/Execute: the same messages in
    the same fair order, with the same columns and types."""
    from django_pgqueue.core import _execution, _send

    for tenant in ("a", "b"):
        enqueue_many(tenant, 3)
    plain = lease(1)[0]
    _execution.dedicate_to_claims(connection)
    sent: list[tuple[str, object]] = []
    real = _send.run

    def spy(*args, **kwargs):
        sent.append((args[1], kwargs["plan"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(_send, "run", spy)
    fast = lease(3)
    assert sent == [(_claim_sql.FLOW_CLAIM, {})]  # no settings sent with it
    assert [plain.tenant] + [m.tenant for m in fast] == ["a", "b", "a", "b"]
    row = Message.objects.get(id=fast[0].id)
    for field in ("queue", "task", "tenant", "attempts", "lease_token", "leased_by", "payload"):
        assert getattr(fast[0], field) == getattr(row, field), field
        assert type(getattr(fast[0], field)) is type(getattr(plain, field)), field
    assert fast[0].leased_at == row.leased_at and fast[0].available_at == row.available_at
    assert [m.tenant for m in lease(5)] == ["a", "b"]
    _execution.end_dedicated_session(connection)


def test_flow_config_is_none_for_plain_queues_and_reads_per_queue_keys():
    assert _flow_control.flow_config("default") is None
    with override_settings(PGQUEUE={"QUEUES": {"q": {"MAX_ATTEMPTS": 2}}}):
        assert _flow_control.flow_config("q") is None
    with override_settings(PGQUEUE={"QUEUES": {"q": {"FAIRNESS": False}}}):
        assert _flow_control.flow_config("q") is None
    with override_settings(
        PGQUEUE={"QUEUES": {"q": {"KEY_CONCURRENCY_LIMIT": 1, "RATE_LIMIT": 5}}}
    ):
        config = _flow_control.flow_config("q")
        assert config is not None and config.keyed and config.key_limited
        assert json.loads(config.settings_json)["rate"] == 5
    with override_settings(PGQUEUE=FAIR):
        config = _flow_control.flow_config("fair")
        assert config is not None and config.keyed and not config.key_limited
    with override_settings(PGQUEUE={"QUEUES": {"q": {"RATE_LIMIT": 5}}}):
        config = _flow_control.flow_config("q")
        assert config is not None and not config.keyed


def test_plain_queue_claim_does_not_touch_flow_tables(django_assert_max_num_queries):
    enqueue_many(None, 3, queue="default")
    with django_assert_max_num_queries(4) as captured:
        assert len(lease(3, queue="default")) == 3
    assert not any("pgqueue_flow" in q["sql"] for q in captured.captured_queries)
    assert not FlowAllowance.objects.exists() and not FlowRate.objects.exists()


# --- index use at scale -----------------------------------------------------------------------


def _explain(statement: str, params: dict[str, object]) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params)
        plan = cursor.fetchone()[0]
    return plan if isinstance(plan, str) else json.dumps(plan)


def _message_scans(plan_json: str) -> set[str]:
    """How the plan reads pgqueue_message: the node types that scan it (the flow state's
    few rows may be read any way)."""
    found: set[str] = set()
    nodes = [json.loads(plan_json)[0]["Plan"]]
    while nodes:
        node = nodes.pop()
        if node.get("Relation Name") == "pgqueue_message" and "Scan" in node["Node Type"]:
            found.add(node["Node Type"])
        nodes.extend(node.get("Plans", []))
    return found


def _total_buffers(plan_json: str) -> int:
    plan = json.loads(plan_json)[0]["Plan"]
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


@pytest.mark.slow
@pytest.mark.scale
@override_settings(
    PGQUEUE={
        "QUEUES": {"fair": {"FAIRNESS": True, "KEY_CONCURRENCY_LIMIT": 5, "KEY_RATE_LIMIT": 100}}
    }
)
def test_every_claim_is_an_index_lookup_with_a_million_ready_messages_over_10000_tenants():
    if _bounds is not None:
        pytest.skip("a queue with key limits is walked from the head, as its other run")
    # As 100 rounds of enqueues by 10,000 tenants would have placed them.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_message "
            "    (queue, task, payload, tenant, enqueued_at, available_at, fair_order) "
            "SELECT 'fair', 't', '{}'::jsonb, 'tenant-' || lpad((g % 10000)::text, 5, '0'), "
            "       now(), now() - interval '1 minute', g / 10000 "
            "FROM generate_series(0, 999999) g"
        )
        cursor.execute("ANALYZE pgqueue_message")
    # Every statement of a claim, those inside the flow-control function too, reads by
    # index: the head of the fair order plus the 100 leased rows, a few thousand buffers at
    # most, not the 1M-row table (~15,000 pages of heap, ~10,000 of index).
    with transaction.atomic():
        with nested_plans(connection) as plans:
            leased = Message.objects.lease("fair", worker_id="w1", batch_size=100, hold=True)
        assert len(leased) == 100
        transaction.set_rollback(True)
    assert len(plans) > 3
    for plan in plans:
        assert unbounded_reads([plan]) == [], plan["Query Text"]
        assert buffers(plan) < 5_000, plan["Query Text"]
    assert any("pgq_message_fair" in json.dumps(plan) for plan in plans)
    # And the real claims, through the public API, share the tenants.
    first = lease(100)
    assert len(first) == 100 and len({m.tenant for m in first}) == 100
    second = lease(100)
    assert len({m.tenant for m in second}) == 100
    assert not {m.tenant for m in first} & {m.tenant for m in second}
    # A new tenant's message joins the round in progress: served before any tenant's second.
    [new] = enqueue_many("newcomer", 1)
    served: list[str] = [m.tenant for m in first + second]
    while True:
        batch = lease(500)
        assert batch
        if new in {m.id for m in batch}:
            break
        served += [m.tenant for m in batch]
    assert len(served) == len(set(served)) < 10_000


def load_rows(admin_conn, queue: str, n: int, *, placed: bool = True) -> None:
    """``n`` ready messages of 50 tenants in one statement, in the fair order if ``placed``
    (as enqueues would have placed them), without touching the table's statistics."""
    admin_conn.execute(
        "INSERT INTO pgqueue_message (queue, task, payload, tenant, fair_order) "
        "SELECT %s, 't', '{}'::jsonb, 'tenant-' || (g %% 50), CASE WHEN %s THEN g / 50.0 END "
        "FROM generate_series(1, %s) g",
        [queue, placed, n],
    )


FLOW_SHAPES = {
    "fair": {"FAIRNESS": True},
    "keyed": {"FAIRNESS": True, "KEY_CONCURRENCY_LIMIT": 5, "KEY_RATE_LIMIT": 100},
    "fair_limits": {"FAIRNESS": True, "CONCURRENCY_LIMIT": 10_000, "RATE_LIMIT": 100_000},
    "limits": {"CONCURRENCY_LIMIT": 10_000},
}


@pytest.mark.parametrize("claim_session", [True, False], ids=["claim-session", "plain"])
@pytest.mark.parametrize("shape", list(FLOW_SHAPES))
def test_a_flow_claim_planned_on_a_small_queue_reads_only_by_index_later(
    admin_conn, shape, claim_session
):
    """As the plain claim (test_leasing.py): each configuration's claim, its statements
    planned and cached while the queue held 2,000 analyzed rows, still reaches every row of
    the live table through an index condition once 20,000 more arrive."""
    from django_pgqueue.core import _execution

    with override_settings(PGQUEUE={"QUEUES": {"fq": FLOW_SHAPES[shape]}}):
        if claim_session:
            _execution.dedicate_to_claims(connection)
        try:
            load_rows(admin_conn, "fq", 2_000, placed=shape != "limits")
            admin_conn.execute("ANALYZE pgqueue_message")
            # Past the five custom plans after which the server may cache a generic one.
            # (Each batch completed: the key limits stay far.)
            for batch in (10, 1, 101, 10, 1, 101, 10, 1):
                leased = Message.objects.lease("fq", worker_id="w1", batch_size=batch)
                assert leased, batch
                transitions.complete(leased)
            load_rows(admin_conn, "fq", 20_000, placed=shape != "limits")  # plans stay
            with nested_plans(connection) as plans:
                for batch in (10, 1, 101):
                    leased = Message.objects.lease("fq", worker_id="w1", batch_size=batch)
                    assert leased, batch
                    transitions.complete(leased)
            assert plans
            for plan in plans:
                assert unbounded_reads([plan]) == [], plan["Query Text"]
        finally:
            _execution.end_dedicated_session(connection)


@override_settings(PGQUEUE=FAIR)
@pytest.mark.parametrize("rows_when_planned", [0, 2000])
def test_an_enqueue_into_a_fair_queue_planned_on_a_small_queue_reads_by_index_later(
    admin_conn, rows_when_planned
):
    """An enqueue into a fair queue reads the fair order (its place in it). In autocommit it
    is a prepared statement; planned while the table was empty, its generic plan read the
    order by sequential scans (O(table) per enqueue for good) when it was a bare
    Bind/Execute under the caller's settings."""
    from django_pgqueue.core import _execution

    load_rows(admin_conn, "fair", rows_when_planned)
    admin_conn.execute("ANALYZE pgqueue_message")
    for n in range(8):  # past the five custom plans after which the server may go generic
        django_pgqueue.enqueue("t", {"n": n}, queue="fair", tenant="tenant-1")
    load_rows(admin_conn, "fair", 20_000)  # no ANALYZE: the plan stays
    [place] = Message.objects.filter(queue="fair", payload__n=7).values_list(
        "fair_order", flat=True
    )
    assert place is not None and place >= 0
    params = {
        "queue": "fair",
        "task": "t",
        "payload": "{}",
        "priority": 0,
        "tenant": "tenant-1",
        "dedup_key": None,
        "max_attempts": 3,
        "composed": False,
        "headers": None,
        "run_at": None,
        "delay": 0.0,
        "step": 1.0,
        "channel": "pgqueue",
        "wake": "fair",
    }
    with connection.cursor() as cursor:
        plans = explain_prepared(cursor, _sql.ENQUEUE_FAIR, params, _execution.CLAIM_PLAN)
    assert plans
    for name, plan in plans.items():
        assert unbounded_reads(plan) == [], (name, plan)
