"""Leasing: order, visibility timeout in database time, SKIP LOCKED exclusivity, self-healing."""

import datetime as dt
import logging
import threading

import pytest
from django.db import connection, connections, transaction

import django_pgqueue
from django_pgqueue.core import _claim, _claim_sql, transitions
from django_pgqueue.core.operations import pause_queue, resume_queue
from django_pgqueue.exceptions import LeaseError
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message
from tests.factories import MessageFactory
from tests.plans import explain_prepared, nodes, unbounded_reads
from tests.sessions import lose_prepared_statements

pytestmark = pytest.mark.django_db(transaction=True)


def lease(**kwargs):
    kwargs.setdefault("worker_id", "w1")
    return Message.objects.lease(kwargs.pop("queues", "default"), **kwargs)


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_higher_priority_first_then_fifo():
    low = [django_pgqueue.enqueue("t", {"n": n}).id for n in range(3)]
    high = [django_pgqueue.enqueue("t", {"n": n}, priority=10).id for n in range(2)]
    leased = [m.id for m in lease(batch_size=10)]
    assert leased == high + low


def test_lease_sets_token_counts_attempt_and_hides_for_the_visibility_timeout():
    django_pgqueue.enqueue("t", {"k": "v"})
    before = db_now()
    [message] = lease(visibility_timeout=120)
    assert message.attempts == 1 and message.lease_token is not None
    assert message.leased_by == "w1" and message.payload == {"k": "v"}
    assert dt.timedelta(seconds=120) <= message.available_at - before < dt.timedelta(seconds=125)
    assert lease(worker_id="w2") == []


@pytest.mark.parametrize("use_tz", [True, False])
def test_leased_fields_equal_the_stored_row_to_the_microsecond(settings, use_tz):
    # Claims send timestamps as epoch microseconds (_manager.py): they must come back exactly
    # as Django itself loads the row, aware in UTC or naive in TIME_ZONE.
    settings.TIME_ZONE = "America/New_York"
    settings.USE_TZ = use_tz
    django_pgqueue.enqueue("t", {"k": [1, 2]}, priority=3, tenant="acme", dedup_key="d1")
    [leased] = lease()
    stored = Message.objects.get(pk=leased.pk)
    for field in Message._meta.concrete_fields:
        if field.attname not in ("errors", "last_error"):
            assert getattr(leased, field.attname) == getattr(stored, field.attname), field
    assert (leased.enqueued_at.tzinfo is None) is (not use_tz)
    assert leased.leased_at.microsecond == stored.leased_at.microsecond


def test_scheduled_message_waits_until_due():
    django_pgqueue.enqueue("t", {}, run_after=dt.timedelta(hours=1))
    assert lease() == []
    Message.objects.update(available_at=db_now() - dt.timedelta(seconds=1))
    assert len(lease()) == 1


def test_expired_lease_is_redelivered_by_itself(caplog):
    message = MessageFactory(expired=True)
    with caplog.at_level(logging.WARNING, logger="django_pgqueue"):
        [again] = lease(worker_id="w2")
    assert again.id == message.id and again.attempts == 2 and again.redelivered
    assert again.lease_token != message.lease_token
    assert "redelivered" in caplog.text


def test_lease_expiring_on_its_last_attempt_goes_dead(caplog):
    message = MessageFactory(expired=True, attempts=3, max_attempts=3)
    with caplog.at_level(logging.WARNING, logger="django_pgqueue"):
        assert lease() == []
    dead = DeadMessage.objects.get(message_id=message.id)
    assert dead.reason == "lease_expired" and dead.attempts == 3
    assert dead.errors[-1]["type"] == "LeaseExpired"
    assert not Message.objects.filter(pk=message.id).exists()
    assert "dead-lettered" in caplog.text


def test_a_message_that_kills_its_worker_every_time_ends_dead_not_looping():
    """Attempts count at claim: crash (lease expiry) max_attempts times -> dead."""
    sent = django_pgqueue.enqueue("t", {}, max_attempts=3)
    for attempt in range(1, 4):
        [m] = lease(worker_id=f"crashing-{attempt}")
        assert m.attempts == attempt
        # The worker dies; its lease runs out.
        Message.objects.filter(pk=m.id).update(available_at=db_now() - dt.timedelta(seconds=1))
    assert lease() == []
    assert DeadMessage.objects.get(message_id=sent.id).reason == "lease_expired"


def test_paused_queue_is_not_leased():
    django_pgqueue.enqueue("t", {})
    pause_queue("default")
    assert lease() == []
    resume_queue("default")
    assert len(lease()) == 1


def test_lease_tries_queues_in_order_until_the_batch_is_full():
    for queue in ("a", "b"):
        for _ in range(3):
            django_pgqueue.enqueue("t", {}, queue=queue)
    leased = lease(queues=["b", "a"], batch_size=4)
    assert [m.queue for m in leased] == ["b", "b", "b", "a"]


def test_lease_inside_atomic_without_hold_is_refused():
    with transaction.atomic(), pytest.raises(LeaseError):
        lease()


def test_hold_mode_needs_a_transaction():
    with pytest.raises(LeaseError):
        lease(hold=True)


def test_hold_mode_rollback_returns_the_whole_batch():
    for n in range(3):
        django_pgqueue.enqueue("t", {"n": n})
    with pytest.raises(RuntimeError), transaction.atomic():
        held = lease(hold=True, batch_size=3)
        assert len(held) == 3
        raise RuntimeError("processing failed")
    assert Message.objects.filter(attempts=0, lease_token__isnull=True).count() == 3
    assert len(lease(batch_size=3)) == 3


def test_hold_mode_commit_keeps_the_completions():
    django_pgqueue.enqueue("t", {})
    with transaction.atomic():
        held = lease(hold=True)
        transitions.complete(held)
    assert Message.objects.count() == 0


def test_hold_mode_rows_stay_locked_for_others():
    django_pgqueue.enqueue("t", {})
    seen: list[int] = []
    with transaction.atomic():
        assert len(lease(hold=True)) == 1
        # Make the lease visible-expired: only the row lock protects it now.
        with connection.cursor() as cursor:
            cursor.execute("UPDATE pgqueue_message SET available_at = now() - interval '1 minute'")

        def other():
            seen.extend(m.id for m in lease(worker_id="other"))
            connections.close_all()

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert seen == []


def test_concurrent_leases_never_share_a_message():
    total = 600
    django_pgqueue.enqueue_many("t", ({"i": i} for i in range(total)))
    got: dict[str, list[int]] = {}
    barrier = threading.Barrier(4)

    def work(name: str) -> None:
        # Each takes a first batch and holds it until all four hold one: the leases overlap
        # in time whatever the machine's load, then they race for the rest.
        mine = [m.id for m in Message.objects.lease("default", worker_id=name, batch_size=7)]
        barrier.wait(timeout=60)
        while batch := Message.objects.lease("default", worker_id=name, batch_size=7):
            mine.extend(m.id for m in batch)
        got[name] = mine
        connections.close_all()

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for ids in got.values() for i in ids]
    assert len(every) == total and len(set(every)) == total
    assert all(got.values()), "every worker got some of the work"


@pytest.mark.slow
@pytest.mark.scale
def test_claim_is_an_index_lookup_on_a_large_backlog(admin_conn):
    admin_conn.execute(
        """
        INSERT INTO pgqueue_message (queue, task, payload, priority, available_at)
        SELECT CASE WHEN g % 10 = 0 THEN 'other' ELSE 'default' END, 't',
               jsonb_build_object('g', g), (g % 3) - 1,
               now() + CASE WHEN g % 4 = 0 THEN interval '1 hour' ELSE interval '0' END
        FROM generate_series(1, 150000) g
        """
    )
    admin_conn.execute("ANALYZE pgqueue_message")
    queryset = (
        Message.objects.claimable("default").select_for_update(skip_locked=True).values("id")[:100]
    )
    with connection.cursor() as cursor, transaction.atomic():
        sql, params = queryset.query.sql_with_params()
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "pgq_message_claim" in plan, plan
    assert "Seq Scan on pgqueue_message" not in plan, plan
    assert "Sort" not in plan, plan
    # And the real thing leases from the head of the queue.
    assert len(lease(batch_size=100)) == 100


def test_claims_survive_a_session_that_drops_prepared_statements(caplog):
    """Behind a pooler in transaction mode the session's prepared claim may vanish: the claim
    then falls back to sending the statement itself, and nothing is claimed twice or lost."""
    from django_pgqueue.core import _send

    for n in range(4):
        django_pgqueue.enqueue("t", {"n": n})
    assert len(lease()) == 1  # prepares the claim on this connection
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%%exhausted%%'"
        )
        assert cursor.fetchone()[0] >= 1, "the claim was prepared"
    lose_prepared_statements(connection)
    with caplog.at_level(logging.WARNING, logger="django_pgqueue"):
        assert len(lease()) == 1
    assert "prepared statement vanished" in caplog.text
    assert connection.connection in _send._unpreparable
    assert len(lease(batch_size=5)) == 2
    assert Message.objects.filter(lease_token__isnull=True).count() == 0


def test_a_claim_session_claims_with_bind_execute_and_the_same_rows(monkeypatch, caplog):
    """A connection dedicated to claims (the worker's) keeps the claim's settings for the
    session and claims with a bare Bind/Execute: same messages, same columns, same types as
    the query-string path; a vanished statement falls back there."""
    from django_pgqueue.core import _execution, _send

    ids = [django_pgqueue.enqueue("t", {"n": n}, tenant="ten").id for n in range(5)]
    plain = _claim.lease("default", worker_id="w1", decode_payloads=False)[0]
    _execution.dedicate_to_claims(connection)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('enable_sort'), current_setting('jit')")
        assert cursor.fetchone() == ("off", "off")
    sent: list[tuple[str, object]] = []
    real = _send.run

    def spy(*args, **kwargs):
        sent.append((args[1], kwargs["plan"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(_send, "run", spy)
    fast = _claim.lease("default", worker_id="w1", decode_payloads=False)[0]
    assert sent == [(_claim_sql.PLAIN_CLAIM, {})]  # no settings sent with it
    assert [plain.id, fast.id] == ids[:2]
    row = Message.objects.get(id=fast.id)
    for field in ("queue", "task", "tenant", "attempts", "lease_token", "leased_by"):
        assert getattr(fast, field) == getattr(row, field), field
        assert type(getattr(fast, field)) is type(getattr(plain, field)), field
    for field in ("enqueued_at", "available_at", "leased_at"):
        assert getattr(fast, field) == getattr(row, field), field
    assert fast.payload == '{"n": 1}' and plain.payload == '{"n": 0}'
    assert lease(batch_size=1)[0].payload == {"n": 2}
    lose_prepared_statements(connection)
    with caplog.at_level(logging.WARNING, logger="django_pgqueue"):
        assert lease(batch_size=1)[0].id == ids[3]
    assert "prepared statement vanished" in caplog.text
    assert [m.id for m in lease(batch_size=5)] == ids[4:]
    assert Message.objects.filter(lease_token__isnull=True).count() == 0


@pytest.mark.parametrize("rows_when_planned", [0, 2000])
def test_a_claim_planned_on_a_small_queue_reads_only_by_index_later(admin_conn, rows_when_planned):
    """A worker that starts on an idle or small queue plans its claim once (a generic plan,
    for a table of a few rows). That plan must still reach every row through an index
    condition when a backlog arrives: a sequential scan, or a hash join against a walk of
    the whole primary key (what a table of 2,000 analyzed rows got), made every claim
    O(table) and the worker slower with every batch as dead rows grew."""
    from django_pgqueue.core import _execution

    def load(n: int) -> None:
        admin_conn.execute(
            "INSERT INTO pgqueue_message (queue, task, payload) "
            "SELECT 'default', 't', jsonb_build_object('n', g) FROM generate_series(1, %s) g",
            [n],
        )

    _execution.dedicate_to_claims(connection)
    try:
        load(rows_when_planned)
        admin_conn.execute("ANALYZE pgqueue_message")
        lease(batch_size=100)  # plans the claim for the table as it is now
        load(20_000)  # no ANALYZE: the plan stays
        assert len(lease(batch_size=100)) == 100
        params = {"queue": "default", "batch": 100, "worker": "w1", "visibility_timeout": 30.0}
        with connection.cursor() as cursor:
            # A claim session runs under the claim's settings already.
            [plan] = explain_prepared(cursor, _claim_sql.PLAIN_CLAIM, params, {}).values()
        assert unbounded_reads(plan) == [], plan
        # The claimed rows by primary key, not by walking the claim index.
        assert any(
            node.get("Index Name") == "pgqueue_message_pkey" and node.get("Index Cond")
            for node in nodes(plan)
        ), plan
    finally:
        _execution.end_dedicated_session(connection)


def test_acks_survive_a_session_that_drops_prepared_statements(caplog):
    """complete / extend / release are session-prepared too, with the same fallback."""
    from django_pgqueue.core import _send

    for n in range(4):
        django_pgqueue.enqueue("t", {"n": n})
    first, second, third, fourth = lease(batch_size=4)
    assert transitions.complete([first]).done == [first.id]  # prepares the ack
    lose_prepared_statements(connection)
    with caplog.at_level(logging.WARNING, logger="django_pgqueue"):
        assert transitions.complete([second], results=[{"ok": True}]).done == [second.id]
    assert connection.connection in _send._unpreparable
    assert transitions.extend([third], 60).done == [third.id]
    assert transitions.release([fourth]).done == [fourth.id]
    archived = ArchivedMessage.objects.order_by("message_id")
    assert [(a.message_id, a.result) for a in archived] == [
        (first.id, None),
        (second.id, {"ok": True}),
    ]
    assert Message.objects.filter(lease_token__isnull=True).count() == 1


def test_repeated_claims_keep_the_worker_id_as_data():
    # Quotes and semicolons in the worker id stay data, claim after claim.
    worker = "w;'x\"; DROP TABLE pgqueue_message; --"
    for n in range(3):
        django_pgqueue.enqueue("t", {"n": n})
        [message] = Message.objects.lease("default", worker_id=worker, batch_size=5)
        assert message.leased_by == worker and message.payload == {"n": n}


def test_lease_can_leave_payloads_as_json_text():
    import json

    for payload in ("hello", {"k": [1, None]}, None):
        django_pgqueue.enqueue("t", payload)
    raw = _claim.lease("default", worker_id="w", batch_size=5, decode_payloads=False)
    assert [json.loads(m.payload) for m in raw] == ["hello", {"k": [1, None]}, None]
    assert all(isinstance(m.payload, str) for m in raw)
