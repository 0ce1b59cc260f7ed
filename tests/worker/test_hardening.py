"""No outcome, notification or stored value breaks a worker or an innocent message.

In-process workers and completers against real PostgreSQL; the handlers whose outcomes
``jsonb`` cannot store are in ``faultapp/handlers.py`` (imported here to register them).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

import django_pgqueue
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message
from django_pgqueue.worker import chores
from django_pgqueue.worker import runner as runner_module
from django_pgqueue.worker.completer import Completer
from django_pgqueue.worker.heartbeat import Stats
from django_pgqueue.worker.storable import storable_text
from tests.factories import MessageFactory

from .conftest import WorkerThread, wait_for
from .faultapp import handlers as fault_handlers

pytestmark = pytest.mark.django_db(transaction=True)
StartWorker = Callable[..., WorkerThread]
NOT_STORABLE = "django_pgqueue.exceptions.ResultNotSerializable"


def dead(message_id: int) -> DeadMessage | None:
    return DeadMessage.objects.filter(message_id=message_id).first()


def archived_ids() -> set[int]:
    return set(ArchivedMessage.objects.values_list("message_id", flat=True))


# -- results and error texts jsonb cannot store ------------------------------------------------


@pytest.mark.parametrize("kind", sorted(fault_handlers.BAD_TEXT))
@pytest.mark.parametrize("where", ["value", "nested", "key"])
def test_an_unstorable_result_is_dead_at_once_and_spares_its_batch_mates(
    start_worker: StartWorker, kind: str, where: str
) -> None:
    good = [django_pgqueue.enqueue("tests.echo", n).id for n in range(5)]
    bad = django_pgqueue.enqueue("faults.return", {"kind": kind, "where": where}).id
    good += [django_pgqueue.enqueue("tests.echo", n).id for n in range(5, 10)]
    runner = start_worker(burst=True, concurrency=2, batch_size=50)
    assert runner.join() == 0
    assert archived_ids() == set(good)
    row = dead(bad)
    assert row is not None and row.reason == "error" and row.attempts == 1
    assert row.details["type"] == NOT_STORABLE
    assert "cannot store" in row.details["message"]
    assert runner.worker.stats.processed == 10 and runner.worker.stats.dead == 1


@override_settings(PGQUEUE={"BACKOFF_BASE": 0.0})
@pytest.mark.parametrize("kind", sorted(fault_handlers.BAD_TEXT))
def test_an_unstorable_error_text_is_stored_escaped(start_worker: StartWorker, kind: str) -> None:
    bad = django_pgqueue.enqueue("faults.raise", {"kind": kind}, max_attempts=2).id
    good = django_pgqueue.enqueue("tests.echo", "fine").id
    assert start_worker(burst=True, batch_size=50).join() == 0
    row = dead(bad)
    assert row is not None and row.reason == "error" and row.attempts == 2
    escaped = storable_text(fault_handlers.BAD_TEXT[kind])
    assert "\\x" in escaped and row.details["message"] == escaped
    assert [e["message"] for e in row.errors] == [escaped, escaped]
    assert escaped in row.details["traceback"]
    assert archived_ids() == {good}


@override_settings(PGQUEUE={"BACKOFF_BASE": 0.0})
def test_an_exception_whose_str_fails_is_an_ordinary_failed_attempt(
    start_worker: StartWorker,
) -> None:
    bad = django_pgqueue.enqueue("faults.raise", {"kind": "broken-str"}, max_attempts=1).id
    assert start_worker(burst=True).join() == 0
    row = dead(bad)
    assert row is not None and row.details["type"].endswith("BrokenStr")
    assert "str() of the" in row.details["message"]


@override_settings(PGQUEUE={"MAX_ERROR_MESSAGE_CHARS": 100, "MAX_TRACEBACK_CHARS": 2_000})
def test_error_texts_are_capped_and_marked(start_worker: StartWorker) -> None:
    bad = django_pgqueue.enqueue(
        "faults.raise", {"kind": "size", "chars": 5_000_000}, max_attempts=1
    ).id
    assert start_worker(burst=True).join() == 0
    row = dead(bad)
    assert row is not None
    for text, cap in ((row.details["message"], 100), (row.errors[0]["message"], 100)):
        assert text.startswith("x" * 100) and text.endswith("…[truncated 4999900 chars]")
        assert len(text) < cap + 40
    trace = row.details["traceback"]
    assert trace.startswith("Traceback (most recent call last):") and "…[truncated " in trace
    assert len(trace) < 2_000 + 40


@override_settings(PGQUEUE={"MAX_RESULT_BYTES": 1_000})
def test_a_result_over_max_result_bytes_is_refused(start_worker: StartWorker) -> None:
    small = django_pgqueue.enqueue("faults.return-size", {"chars": 900}).id
    big = django_pgqueue.enqueue("faults.return-size", {"chars": 2_000}).id
    assert start_worker(burst=True).join() == 0
    assert archived_ids() == {small}
    row = dead(big)
    assert row is not None and row.attempts == 1 and row.details["type"] == NOT_STORABLE
    assert "MAX_RESULT_BYTES (1000)" in row.details["message"]


# -- the completer's own defence: a batch the database refuses is written row by row -----------


def leased(count: int, task: str = "tests.echo") -> list[Message]:
    for n in range(count):
        django_pgqueue.enqueue(task, n, queue="cmp")
    return Message.objects.lease("cmp", worker_id="w-cmp", batch_size=count)


def completer() -> Completer:
    return Completer(
        alias="default", flush_interval=0, flush_size=100, stats=Stats(), abort=threading.Event()
    )


def test_a_refused_result_dead_letters_only_its_own_message() -> None:
    messages = leased(6)
    writer = completer()
    for n, message in enumerate(messages):
        # As if a result got past the handler thread's check: "\u0000" is refused by jsonb.
        writer.complete(message, json.dumps("a\x00b") if n == 3 else json.dumps(n))
    writer.flush()
    refused = messages[3].id
    assert archived_ids() == {m.id for m in messages} - {refused}
    row = dead(refused)
    assert row is not None and row.reason == "error" and row.details["type"] == NOT_STORABLE
    assert "database refused to store" in row.details["message"]
    assert row.details["worker"] == "w-cmp"
    assert writer.stats.processed == 5 and writer.stats.dead == 1
    assert writer.pending() == 0


def test_what_piled_up_is_written_in_statements_of_the_flush_size(monkeypatch) -> None:
    # A batch that waited (an outage, a slow statement) must not become one statement whose
    # cost grows with it: the write after it would be slower still, and so on.
    from django_pgqueue.core import transitions

    sizes: list[int] = []
    real = transitions.complete_encoded

    def counted(ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        sizes.append(len(ids))
        return real(ids, *args, **kwargs)

    monkeypatch.setattr(transitions, "complete_encoded", counted)
    messages = leased(7)
    writer = Completer(
        alias="default", flush_interval=0, flush_size=3, stats=Stats(), abort=threading.Event()
    )
    for n, message in enumerate(messages):
        writer.complete(message, json.dumps(n))
    writer.flush()
    assert sizes == [3, 3, 1]
    assert archived_ids() == {m.id for m in messages}
    assert writer.pending() == 0


def test_a_flush_reports_the_queues_whose_leases_it_ended() -> None:
    # What lets a worker claim again at once from a queue a limit had cut short.
    from django_pgqueue.core import transitions

    written: list[set[str]] = []
    messages = leased(3)
    writer = Completer(
        alias="default",
        flush_interval=0,
        flush_size=100,
        stats=Stats(),
        abort=threading.Event(),
        on_written=written.append,
    )
    writer.flush()
    assert written == []  # nothing to write: no call
    writer.complete(messages[0], None)
    error = transitions.error_entry(attempt=1, type_name="E", message="x")
    writer.fail(transitions.FailedAttempt(messages[1], error, retry_in=60), messages[1])
    writer.flush()
    assert written == [{"cmp"}]


def test_a_refused_error_entry_is_recorded_without_its_text() -> None:
    from django_pgqueue.core import transitions

    messages = leased(4)
    writer = completer()
    for n, message in enumerate(messages):
        error = transitions.error_entry(
            attempt=message.attempts,
            type_name="ValueError",
            message="bad \x00 text" if n == 1 else f"plain {n}",
        )
        writer.fail(transitions.FailedAttempt(message, error, retry_in=None), message)
    writer.flush()
    rows = {d.message_id: d for d in DeadMessage.objects.all()}
    assert set(rows) == {m.id for m in messages}
    assert rows[messages[1].id].details["message"].startswith("the error text could not be stored")
    assert rows[messages[1].id].details["type"] == "ValueError"
    assert [rows[m.id].details["message"] for m in messages if m is not messages[1]] == [
        "plain 0",
        "plain 2",
        "plain 3",
    ]


def test_an_unexpected_error_keeps_the_outcomes_for_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    messages = leased(3)
    writer = completer()
    for message in messages:
        writer.complete(message, None)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr("django_pgqueue.core.transitions.complete_encoded", broken)
    with pytest.raises(RuntimeError):
        writer.flush()
    assert writer.take_unwritten() == [(m.id, m.lease_token) for m in messages]
    assert writer.pending() == 0


# -- logs: the exception type and a bounded excerpt, never the whole text ---------------------


@pytest.mark.parametrize(
    ("chars", "logged"),
    [(20, "builtins.ValueError: always fails: 'card=…"), (0, "builtins.ValueError")],
)
def test_retries_and_dead_letters_log_a_bounded_excerpt(
    start_worker: StartWorker, caplog: pytest.LogCaptureFixture, chars: int, logged: str
) -> None:
    caplog.set_level(logging.INFO, logger="django_pgqueue")
    secret = "card=4111 1111 1111 1111"
    with override_settings(PGQUEUE={"BACKOFF_BASE": 0.0, "LOG_ERROR_CHARS": chars}):
        msg = django_pgqueue.enqueue("tests.fail", secret, max_attempts=2)
        assert start_worker(burst=True).join() == 0
    lines = [r.getMessage() for r in caplog.records if f"Message {msg.id} " in r.getMessage()]
    assert len(lines) == 2  # one retry, one dead-letter
    retry, dead_letter = lines
    assert f"({logged});" in retry and dead_letter.endswith(f"attempts: {logged}")
    row = dead(msg.id)
    assert row is not None and secret in row.details["message"]  # the full text stays here


# -- notifications are hints ------------------------------------------------------------------


def test_a_malformed_notification_is_logged_once_and_ignored(
    start_worker: StartWorker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="django_pgqueue")
    runner = start_worker(poll_interval=30)
    with connection.cursor() as cursor:
        for payload in ("Bad Name!", "Bad Name!", "x" * 300, "Bad Name!:later", ":later"):
            cursor.execute("SELECT pg_notify('django_pgqueue', %s)", [payload])
    msg = django_pgqueue.enqueue("tests.echo", "still here")
    wait_for(lambda: ArchivedMessage.objects.filter(message_id=msg.id).exists(), timeout=5)
    warnings = [r for r in caplog.records if "names no queue" in r.getMessage()]
    assert [r.levelname for r in warnings if r.levelno >= logging.WARNING] == ["WARNING"]
    assert runner.thread.is_alive()
    assert runner.stop() == 0


# -- queue discovery ----------------------------------------------------------------------------


@pytest.mark.parametrize("queues", [[], ["lonely"]], ids=["all-queues", "with-queue"])
def test_an_expired_last_attempt_lease_alone_in_its_queue_is_buried(
    start_worker: StartWorker, queues: list[str]
) -> None:
    row: Message = MessageFactory(queue="lonely", task="tests.echo", expired=True, max_attempts=1)
    runner = start_worker(queues=queues, poll_interval=0.5)
    buried = wait_for(lambda: dead(row.id), timeout=3)  # within a poll interval or so
    assert buried.reason == "lease_expired"
    assert runner.stop() == 0


# -- stored values out of Python's range --------------------------------------------------------


FAR_VALUES = {"far-inf": "infinity", "far-year": "275817-01-01 00:00:00+00"}


@override_settings(PGQUEUE={"STALE_READY_WARNING": 0.2})
@pytest.mark.parametrize("queues", [[], ["far-inf", "far-year", "near"]], ids=["all", "fixed"])
def test_far_future_and_infinite_due_times_do_not_break_a_worker(
    start_worker: StartWorker, queues: list[str]
) -> None:
    # Written by SQL, as an old version or a careless script could: no datetime holds them.
    # And a message ready since forever in a queue nobody serves (the stale-ready check).
    values = {**FAR_VALUES, "far-unserved": "-infinity"}
    with connection.cursor() as cursor:
        for queue, value in values.items():
            row: Message = MessageFactory(queue=queue, task="tests.echo")
            cursor.execute(
                "UPDATE pgqueue_message SET available_at = %s::timestamptz WHERE id = %s",
                [value, row.id],
            )
    runner = start_worker(queues=queues, exclude_queues=["far-unserved"], poll_interval=0.2)
    msg = django_pgqueue.enqueue("tests.echo", "due now", queue="near")
    wait_for(lambda: ArchivedMessage.objects.filter(message_id=msg.id).exists(), timeout=5)
    time.sleep(1.0)  # several polls, due-time look-ups and stale-ready checks
    assert runner.thread.is_alive() and runner.worker.crashed is None
    assert runner.stop() == 0
    assert Message.objects.filter(queue__in=list(values)).count() == 3


@pytest.mark.parametrize("value", ["infinity", "-infinity", "275817-01-01 00:00:00+00"])
def test_a_message_enqueued_at_an_unloadable_time_runs(
    start_worker: StartWorker, value: str
) -> None:
    msg = django_pgqueue.enqueue("tests.echo", "old or odd", queue="odd-time")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_message SET enqueued_at = %s::timestamptz WHERE id = %s",
            [value, msg.id],
        )
    runner = start_worker(queues=["odd-time"], burst=True)
    assert runner.join() == 0 and runner.worker.crashed is None
    # The archive keeps the stored value as it was (no datetime is loaded to check it here).
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM {ArchivedMessage._meta.db_table} "
            "WHERE message_id = %s AND enqueued_at = %s::timestamptz",
            [msg.id, value],
        )
        assert cursor.fetchone() == (1,)


# -- listener probes --------------------------------------------------------------------------


def test_only_a_deaf_worker_reconnects_its_listener(
    start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chores, "PROBE_INTERVAL", 0.4)
    deaf, hearing = start_worker(), start_worker()
    reconnects = {deaf: 0, hearing: 0}
    for runner in (deaf, hearing):
        listener = runner.worker.listener
        assert listener is not None

        def count(runner: WorkerThread = runner, original: Any = listener.reconnect) -> None:
            reconnects[runner] += 1
            original()

        listener.reconnect = count  # type: ignore[method-assign]
    time.sleep(1.5)  # three probes each, every one heard by both listeners
    assert reconnects == {deaf: 0, hearing: 0}
    deaf_listener = deaf.worker.listener
    assert deaf_listener is not None
    deaf_listener.on_probe = lambda payload: None  # hears nothing from now on
    wait_for(lambda: reconnects[deaf] >= 2)
    assert reconnects[hearing] == 0
    assert deaf.stop() == 0 and hearing.stop() == 0


# -- limits of the command line ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [("--batch-size", "10001", "[1, 10000]"), ("--concurrency", "1001", "[1, 1000]")],
)
def test_the_command_line_bounds_batch_size_and_concurrency(
    option: str, value: str, fragment: str
) -> None:
    with pytest.raises(CommandError) as caught:
        call_command("pgq_worker", option, value, "--burst")
    assert fragment in str(caught.value)


def test_the_python_api_bounds_batch_size_too() -> None:
    with pytest.raises(ValueError, match=r"\[1, 10000\]"):
        runner_module.Worker(runner_module.WorkerOptions(batch_size=10_001))
