"""Transitions: complete, fail (retry with backoff / bury), extend, release, operator moves.

A message id is at every instant in exactly one of live / archive / dead.
"""

import datetime as dt
import random
import threading
import uuid

import pytest
from django.db import connection, connections

import django_pgqueue
from django_pgqueue.core import _sql, operations, transitions
from django_pgqueue.core.transitions import FailedAttempt, backoff_delay, error_entry
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message
from tests.conftest import drain
from tests.factories import ArchivedMessageFactory, DeadMessageFactory, MessageFactory
from tests.plans import explain_prepared, unbounded_reads

pytestmark = pytest.mark.django_db(transaction=True)


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def lease_one(**kwargs):
    [message] = Message.objects.lease("default", worker_id=kwargs.pop("worker_id", "w1"), **kwargs)
    return message


def tables_holding(message_id):
    return [
        name
        for name, present in (
            ("live", Message.objects.filter(pk=message_id).exists()),
            ("archive", ArchivedMessage.objects.filter(message_id=message_id).exists()),
            ("dead", DeadMessage.objects.filter(message_id=message_id).exists()),
        )
        if present
    ]


def test_complete_archives_with_result_and_timing():
    sent = django_pgqueue.enqueue("t", {"p": 1}, priority=5)
    message = lease_one()
    outcome = transitions.complete([message], [{"ok": True}])
    assert outcome.done == [sent.id] and outcome.stale == []
    archived = ArchivedMessage.objects.get(message_id=sent.id)
    assert archived.result == {"ok": True} and archived.payload == {"p": 1}
    assert archived.priority == 5 and archived.attempts == 1 and archived.worker_id == "w1"
    assert archived.started_at <= archived.finished_at
    assert tables_holding(sent.id) == ["archive"]


def test_complete_with_a_stale_token_changes_nothing():
    django_pgqueue.enqueue("t", {})
    message = lease_one()
    # The lease expired and another worker took the message.
    Message.objects.update(available_at=db_now() - dt.timedelta(seconds=1))
    taken = lease_one(worker_id="w2")
    outcome = transitions.complete([message])
    assert outcome.done == [] and outcome.stale == [message.id]
    assert tables_holding(message.id) == ["live"]
    assert transitions.complete([taken]).done == [message.id]


def test_batch_complete_moves_each_fenced_pair_only():
    for n in range(3):
        django_pgqueue.enqueue("t", {"n": n})
    batch = Message.objects.lease("default", worker_id="w1", batch_size=3)
    forged = (batch[2].id, uuid.uuid4())
    outcome = transitions.complete([batch[0], batch[1], forged])
    assert sorted(outcome.done) == sorted([batch[0].id, batch[1].id])
    assert outcome.stale == [batch[2].id]


def test_each_result_lands_on_its_own_message_whatever_the_batch_order():
    sent = [django_pgqueue.enqueue("t", {"n": n}).id for n in range(5)]
    batch = Message.objects.lease("default", worker_id="w1", batch_size=5)
    shuffled = random.Random(7).sample(batch, len(batch))
    outcome = transitions.complete(shuffled, [{"for": m.id} for m in shuffled])
    assert sorted(outcome.done) == sorted(sent)
    for archived in ArchivedMessage.objects.filter(message_id__in=sent):
        assert archived.result == {"for": archived.message_id}


def test_each_failure_lands_on_its_own_message_whatever_the_batch_order():
    sent = [django_pgqueue.enqueue("t", {"n": n}, max_attempts=3).id for n in range(4)]
    batch = Message.objects.lease("default", worker_id="w1", batch_size=4)
    before = db_now()
    # Odd ids are buried, even ones retried after as many minutes as their position.
    attempts = [
        FailedAttempt(
            m,
            error_entry(attempt=1, type_name="E", message=f"for {m.id}"),
            retry_in=None if m.id % 2 else 60.0 * (k + 1),
            final_reason="rejected",
        )
        for k, m in enumerate(reversed(batch))
    ]
    outcome = transitions.fail(attempts)
    assert sorted(outcome.done) == sorted(sent)
    assert sorted(outcome.buried) == sorted(i for i in sent if i % 2)
    for dead in DeadMessage.objects.filter(message_id__in=sent):
        assert dead.details["message"] == f"for {dead.message_id}" and dead.reason == "rejected"
    for attempt in attempts:
        if attempt.retry_in is not None:
            row = Message.objects.get(pk=attempt.lease.id)
            assert row.last_error["message"] == f"for {row.id}"
            wait = (row.available_at - before).total_seconds()
            assert attempt.retry_in <= wait < attempt.retry_in + 5


def test_a_token_paired_with_another_messages_id_fences_both():
    # Each lease token is valid, but each is presented with the other message's id.
    for n in range(2):
        django_pgqueue.enqueue("t", {"n": n})
    first, second = Message.objects.lease("default", worker_id="w1", batch_size=2)
    crossed = [(first.id, second.lease_token), (second.id, first.lease_token)]
    assert transitions.complete(crossed).done == []
    assert transitions.extend(crossed, 600).done == []
    assert transitions.release(crossed).done == []
    failed = [FailedAttempt(lease, error_entry(attempt=1), retry_in=0) for lease in crossed]
    assert transitions.fail(failed).done == []
    assert Message.objects.filter(lease_token__isnull=False).count() == 2


def test_a_message_that_is_not_leased_is_fenced_from_a_lease_without_token():
    sent = django_pgqueue.enqueue("t", {})
    django_pgqueue.enqueue("t", {})
    released = lease_one()
    transitions.release([released])  # its token is NULL again
    leased = lease_one()
    assert leased.id != sent.id
    for batch in ([(sent.id, None)], [(sent.id, None), leased]):
        assert sent.id not in transitions.extend(batch, 600).done
        failed = [FailedAttempt(lease, error_entry(attempt=1), retry_in=0) for lease in batch]
        assert sent.id not in transitions.fail(failed).done
        assert sent.id not in transitions.release(batch).done
        assert sent.id not in transitions.complete(batch).done
        row = Message.objects.get(pk=sent.id)
        assert row.lease_token is None and row.errors == [] and row.attempts == 0
    assert tables_holding(sent.id) == ["live"]


def test_the_same_message_twice_in_a_batch_with_a_stale_token_first():
    # A lease expired and the same worker took the message again: both acks in one flush.
    django_pgqueue.enqueue("t", {})
    expired = lease_one()
    Message.objects.update(available_at=db_now() - dt.timedelta(seconds=1))
    current = lease_one()
    assert transitions.extend([expired, current], 600).done == [current.id]
    assert transitions.complete([expired, current]).done == [current.id]
    assert tables_holding(current.id) == ["archive"]


def test_fail_retries_later_with_backoff_and_keeps_history():
    sent = django_pgqueue.enqueue("t", {}, max_attempts=3)
    message = lease_one()
    before = db_now()
    entry = error_entry(ValueError("boom"), attempt=1, worker_id="w1")
    outcome = transitions.fail([FailedAttempt(message, entry, retry_in=30)])
    assert outcome.retried == [sent.id]
    row = Message.objects.get(pk=sent.id)
    assert row.lease_token is None and row.attempts == 1
    assert dt.timedelta(seconds=30) <= row.available_at - before < dt.timedelta(seconds=35)
    assert row.errors[0]["type"] == "builtins.ValueError" and row.errors[0]["message"] == "boom"
    assert (
        "Traceback" in row.errors[0]["traceback"]
        or row.errors[0]["traceback"] == ("builtins.ValueError: boom\n")
        or "ValueError: boom" in row.errors[0]["traceback"]
    )
    assert row.last_error["message"] == "boom"


def test_fail_on_the_last_attempt_buries_with_details_and_full_history():
    sent = django_pgqueue.enqueue("t", {}, max_attempts=2)
    for attempt in (1, 2):
        message = lease_one()
        Message.objects.filter(pk=sent.id).update(available_at=db_now())  # skip the wait
        outcome = transitions.fail(
            [
                FailedAttempt(
                    message, error_entry(KeyError(f"k{attempt}"), attempt=attempt), retry_in=0
                )
            ]
        )
        Message.objects.filter(pk=sent.id).update(available_at=db_now())
    assert outcome.buried == [sent.id]
    dead = DeadMessage.objects.get(message_id=sent.id)
    assert dead.reason == "error" and dead.attempts == 2
    assert [e["attempt"] for e in dead.errors] == [1, 2]
    assert dead.details["type"] == "builtins.KeyError"
    assert tables_holding(sent.id) == ["dead"]


def test_fail_without_retry_buries_at_once_with_its_reason():
    sent = django_pgqueue.enqueue("unknown-task", {}, max_attempts=5)
    message = lease_one()
    entry = error_entry(attempt=1, type_name="UnknownTask", message="no handler")
    transitions.fail([FailedAttempt(message, entry, retry_in=None, final_reason="rejected")])
    dead = DeadMessage.objects.get(message_id=sent.id)
    assert dead.reason == "rejected" and dead.details["message"] == "no handler"


def test_fail_with_stale_token_is_fenced():
    django_pgqueue.enqueue("t", {})
    message = lease_one()
    forged = FailedAttempt((message.id, uuid.uuid4()), error_entry(attempt=1), retry_in=0)
    assert transitions.fail([forged]).stale == [message.id]
    assert Message.objects.get(pk=message.id).lease_token == message.lease_token


def test_extend_and_set_vt():
    django_pgqueue.enqueue("t", {})
    message = lease_one(visibility_timeout=5)
    before = db_now()
    assert transitions.extend([message], 600).done == [message.id]
    row = Message.objects.get(pk=message.id)
    assert dt.timedelta(seconds=600) <= row.available_at - before < dt.timedelta(seconds=605)
    assert transitions.extend([(message.id, uuid.uuid4())], 600).stale == [message.id]


def test_release_makes_the_message_available_now_and_takes_back_the_attempt():
    django_pgqueue.enqueue("t", {})
    message = lease_one(visibility_timeout=600)
    assert transitions.release([message]).done == [message.id]
    again = lease_one(worker_id="w2")
    assert again.id == message.id and again.attempts == 1


def test_backoff_schedule_doubles_and_caps():
    delays = [backoff_delay(n, base=2, maximum=60, jitter=0) for n in range(1, 8)]
    assert delays == [2, 4, 8, 16, 32, 60, 60]


def test_backoff_jitter_stays_within_bounds():
    rng = random.Random(42)
    delays = {backoff_delay(3, base=1, maximum=100, jitter=0.25, rng=rng) for _ in range(200)}
    assert min(delays) >= 3 and max(delays) <= 5 and len(delays) > 100


def test_retry_dead_returns_it_live_with_the_same_id_and_attempts_reset(listener):
    dead = DeadMessageFactory(queue="mail", attempts=3)
    outcome = operations.retry_dead([dead.message_id])
    assert outcome.done == [dead.message_id]
    live = Message.objects.get(pk=dead.message_id)
    assert live.attempts == 0 and live.queue == "mail" and live.payload == dead.payload
    assert tables_holding(dead.message_id) == ["live"]
    assert drain(listener) == [("django_pgqueue", "mail")]


def test_concurrent_retries_of_one_dead_message_make_exactly_one_live_message():
    dead = DeadMessageFactory()
    barrier = threading.Barrier(4)
    results = []

    def retry():
        barrier.wait()
        results.append(operations.retry_dead([dead.message_id]).done)
        connections.close_all()

    threads = [threading.Thread(target=retry) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(len(r) for r in results) == [0, 0, 0, 1]
    assert Message.objects.filter(pk=dead.message_id).count() == 1
    assert not DeadMessage.objects.exists()


def test_retry_dead_keeps_it_dead_when_its_dedup_key_is_live():
    dead = DeadMessageFactory(dedup_key="k")
    django_pgqueue.enqueue("t", {}, dedup_key="k")
    assert operations.retry_dead([dead.message_id]).stale == [dead.message_id]
    assert DeadMessage.objects.filter(pk=dead.pk).exists()


def test_discard_moves_live_to_dead():
    message = MessageFactory()
    assert operations.discard([message.id]).done == [message.id]
    assert DeadMessage.objects.get(message_id=message.id).reason == "discarded"


def test_requeue_archived_makes_a_new_message():
    archived = ArchivedMessageFactory(payload={"again": 1})
    [new_id] = operations.requeue_archived([archived.id])
    assert new_id != archived.message_id
    assert Message.objects.get(pk=new_id).payload == {"again": 1}


def test_retry_now_and_release_leases():
    waiting = MessageFactory(available_at=db_now() + dt.timedelta(hours=1))
    stuck = MessageFactory(leased=True)
    assert operations.retry_now([waiting.id, stuck.id]).done == [waiting.id]
    assert operations.release_leases([stuck.id, waiting.id]).done == [stuck.id]
    ids = {m.id for m in Message.objects.lease("default", worker_id="w", batch_size=5)}
    assert ids == {waiting.id, stuck.id}


def test_purge_queue_deletes_only_that_queue():
    MessageFactory.create_batch(3, queue="junk")
    MessageFactory(queue="keep")
    assert operations.purge_queue("junk") == 3
    assert list(Message.objects.values_list("queue", flat=True)) == ["keep"]


def test_every_id_is_in_exactly_one_table_after_mixed_traffic():
    ids = [django_pgqueue.enqueue("t", {"n": n}, max_attempts=1).id for n in range(30)]
    batch = Message.objects.lease("default", worker_id="w", batch_size=30)
    transitions.complete(batch[:10])
    transitions.fail([FailedAttempt(m, error_entry(attempt=1), retry_in=0) for m in batch[10:20]])
    transitions.release(batch[20:25])
    for message_id in ids:
        assert len(tables_holding(message_id)) == 1, message_id


def test_acks_inside_the_callers_transaction_never_make_its_commit_asynchronous():
    from django.db import transaction

    django_pgqueue.enqueue("t", {})
    message = lease_one()
    with transaction.atomic(), connection.cursor() as cursor:
        transitions.complete([message])
        cursor.execute("SELECT current_setting('synchronous_commit')")
        assert cursor.fetchone()[0] == "on"
    assert ArchivedMessage.objects.filter(message_id=message.id).exists()


@pytest.mark.parametrize("synchronous", [True, False])
def test_synchronous_acks_setting_keeps_the_same_outcome(synchronous):
    from django.test import override_settings

    with override_settings(PGQUEUE={"SYNCHRONOUS_ACKS": synchronous}):
        django_pgqueue.enqueue("t", {})
        message = lease_one()
        assert transitions.extend([message], 60).done == [message.id]
        assert transitions.complete([message]).done == [message.id]
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('synchronous_commit')")
        assert cursor.fetchone()[0] == "on", "SET LOCAL must not leak into the session"


def test_a_connection_dedicated_to_acks_sends_each_ack_alone(monkeypatch):
    """A worker's completer keeps the transitions' settings for its session: an ack is the
    prepared statement alone, with the same outcome; once the session ends, the thread's
    next connection has Django's settings again."""
    from django_pgqueue.core import _execution, _send

    for n in range(3):
        django_pgqueue.enqueue("t", {"n": n})
    first, second, third = Message.objects.lease("default", worker_id="w1", batch_size=3)
    _execution.dedicate_to_acks(connection)
    sent: list[object] = []
    real = _send.run

    def spy(*args, **kwargs):
        sent.append(kwargs["plan"])
        return real(*args, **kwargs)

    monkeypatch.setattr(_send, "run", spy)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('enable_hashjoin')")
            assert cursor.fetchone()[0] == "off"
        assert transitions.complete([first], [{"ok": 1}]).done == [first.id]
        assert sent == [{}]
        assert ArchivedMessage.objects.get(message_id=first.id).result == {"ok": 1}
        assert transitions.extend([second], 60).done == [second.id]
        assert sent[-1] == {}
    finally:
        _execution.end_dedicated_session(connection)
    assert connection.connection is None, "closed: the next statement gets Django's settings"
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('enable_hashjoin')")
        assert cursor.fetchone()[0] == "on"
    assert transitions.complete([third]).done == [third.id]


def test_leased_message_loads_its_error_history_lazily():
    sent = django_pgqueue.enqueue("t", {}, max_attempts=3)
    message = lease_one()
    transitions.fail([FailedAttempt(message, error_entry(ValueError("x"), attempt=1), retry_in=0)])
    again = lease_one()
    assert again.id == sent.id
    assert [e["message"] for e in again.errors] == ["x"]


@pytest.mark.parametrize("rows_when_planned", [0, 4, 2_000])
def test_acks_planned_on_a_small_queue_read_only_by_index_later(admin_conn, rows_when_planned):
    # As the claims (test_leasing.py): complete, fail, extend and release are prepared once
    # per session; their generic plans, made while the table held no or a few analyzed rows
    # (as after a vacuum of a drained queue), still find each lease by primary key once
    # 20,000 more rows arrive.
    from django_pgqueue.core import _execution

    def load(n: int) -> None:
        admin_conn.execute(
            "INSERT INTO pgqueue_message (queue, task, payload) "
            "SELECT 'default', 't', '{}'::jsonb FROM generate_series(1, %s) g",
            [n],
        )

    load(rows_when_planned)
    admin_conn.execute("ANALYZE pgqueue_message")
    load(max(0, 4 - rows_when_planned))  # the leases acknowledged below
    leased = Message.objects.lease("default", worker_id="w1", batch_size=4)
    transitions.extend(leased[:1], 60)
    transitions.release(leased[1:2])
    transitions.fail([FailedAttempt(leased[2].lease, error_entry(attempt=1), 1.0)])
    transitions.complete(leased[3:])
    load(20_000)  # no ANALYZE: the plans stay
    ids, tokens = "{1,2}", f"{{{uuid.uuid4()},{uuid.uuid4()}}}"
    arguments = {
        "complete": [ids, tokens, None],
        "fail": [ids, tokens, ['{"a": 1}', '{"a": 1}'], ["error", "error"], [1.0, 1.0]],
        "extend": [60.0, ids, tokens],
        "release": [True, ids, tokens],
    }
    plan_settings = {"plan_cache_mode": "force_generic_plan", **_execution.BY_ID_PLAN}
    with connection.cursor() as cursor:
        for kind, params in arguments.items():
            statement = getattr(_sql, kind.upper())
            [plan] = explain_prepared(cursor, statement, params, plan_settings).values()
            assert unbounded_reads(plan) == [], (kind, plan)
