"""The worker in-process on a thread against real PostgreSQL: dispatch, failures, wake-ups."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings

import django_pgqueue
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message, WorkerHeartbeat
from django_pgqueue.worker.fetcher import Fetcher
from tests.factories import QueueStateFactory

from .conftest import WorkerThread, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
StartWorker = Callable[..., WorkerThread]


def archived(message_id: int) -> ArchivedMessage | None:
    return ArchivedMessage.objects.filter(message_id=message_id).first()


def dead(message_id: int) -> DeadMessage | None:
    return DeadMessage.objects.filter(message_id=message_id).first()


def test_burst_runs_every_ready_message_and_stores_results(start_worker: StartWorker) -> None:
    ids = [django_pgqueue.enqueue("tests.echo", {"n": n}).id for n in range(30)]
    runner = start_worker(burst=True, concurrency=3, batch_size=7)
    assert runner.join() == 0
    rows = {a.message_id: a for a in ArchivedMessage.objects.all()}
    assert set(rows) == set(ids)
    assert all(rows[i].result == rows[i].payload for i in ids)
    assert all(rows[i].attempts == 1 and rows[i].worker_id == runner.worker.worker_id for i in ids)
    assert not Message.objects.exists()


@pytest.mark.parametrize("task", ["tests.echo", "tests.async-echo-any"])
def test_handlers_get_every_kind_of_json_payload_decoded(
    start_worker: StartWorker, task: str
) -> None:
    # The worker leases payloads as JSON text and each handler's thread decodes its own: a
    # JSON string must arrive as that string, not as its JSON text (nor decoded twice).
    payloads = ["hello", '"quoted"', "[1]", 0, 2.5, None, True, [1, {"a": None}], {"é": "\\"}]
    ids = [django_pgqueue.enqueue(task, p).id for p in payloads]
    assert start_worker(burst=True, concurrency=3).join() == 0
    results = {a.message_id: a.result for a in ArchivedMessage.objects.all()}
    assert [results[i] for i in ids] == payloads


def test_unknown_task_is_dead_as_rejected_without_running(start_worker: StartWorker) -> None:
    msg = django_pgqueue.enqueue("tests.nobody-handles-this", {"x": 1})
    start_worker(burst=True).join()
    row = dead(msg.id)
    assert row is not None and row.reason == "rejected"
    assert row.details["type"] == "UnknownTask"
    assert "tests.nobody-handles-this" in row.details["message"]
    assert row.attempts == 1


@override_settings(PGQUEUE={"BACKOFF_BASE": 0.0, "BACKOFF_JITTER": 0.0})
def test_raising_handler_is_retried_then_dead_with_history(start_worker: StartWorker) -> None:
    msg = django_pgqueue.enqueue("tests.fail", {"why": "bug"}, max_attempts=3)
    ok = django_pgqueue.enqueue("tests.echo", {"fine": True})
    start_worker(burst=True).join()
    row = dead(msg.id)
    assert row is not None and row.reason == "error"
    assert row.attempts == 3
    assert [e["attempt"] for e in row.errors] == [1, 2, 3]
    assert row.details["type"] == "builtins.ValueError"
    assert "always fails" in row.details["message"]
    assert "Traceback" in row.details["traceback"]
    assert archived(ok.id) is not None


def test_non_json_result_is_a_failed_attempt(start_worker: StartWorker) -> None:
    msg = django_pgqueue.enqueue("tests.not-json", None, max_attempts=1)
    start_worker(burst=True).join()
    row = dead(msg.id)
    assert row is not None and row.reason == "error"
    assert "ResultNotSerializable" in row.details["type"]
    assert "not JSON-serializable" in row.details["message"]


@override_settings(PGQUEUE={"BACKOFF_BASE": 0.0})
@pytest.mark.parametrize("task", ["tests.timeout", "tests.async-timeout"])
def test_timeout_retries_then_dies_with_reason_timeout(
    start_worker: StartWorker, task: str
) -> None:
    msg = django_pgqueue.enqueue(task, {"seconds": 3}, max_attempts=2)
    started = time.monotonic()
    start_worker(burst=True, concurrency=2).join()
    assert time.monotonic() - started < 2.5  # two 0.3 s timeouts, not two 3 s sleeps
    row = dead(msg.id)
    assert row is not None and row.reason == "timeout"
    assert [e["type"] for e in row.errors] == ["Timeout", "Timeout"]


def test_async_handler_gets_context_and_payload(start_worker: StartWorker) -> None:
    msgs = [django_pgqueue.enqueue("tests.async-echo", {"n": n, "seconds": 0.05}) for n in range(8)]
    started = time.monotonic()
    start_worker(burst=True, concurrency=8).join()
    assert time.monotonic() - started < 3
    for n, msg in enumerate(msgs):
        row = archived(msg.id)
        assert row is not None
        assert row.result == {"payload": {"n": n, "seconds": 0.05}, "attempt": 1}


def test_notify_wakes_an_idle_worker_at_once(start_worker: StartWorker) -> None:
    runner = start_worker(poll_interval=30)
    time.sleep(0.2)
    sent = time.monotonic()
    msg = django_pgqueue.enqueue("tests.echo", {"hi": 1})
    wait_for(lambda: archived(msg.id), timeout=2)
    assert time.monotonic() - sent < 1.0
    assert runner.stop() == 0


@override_settings(PGQUEUE={"COMPLETION_FLUSH_INTERVAL": 30.0})
def test_a_worker_with_nothing_left_to_run_writes_its_outcomes_at_once(
    start_worker: StartWorker,
) -> None:
    """Completions wait for a batch only while more work is running or waiting: the last
    outcome of a burst is written when the worker goes idle, not after the flush interval."""
    runner = start_worker(poll_interval=30)
    time.sleep(0.2)
    ids = [django_pgqueue.enqueue("tests.echo", {"n": n}).id for n in range(3)]
    wait_for(lambda: ArchivedMessage.objects.filter(message_id__in=ids).count() == 3, timeout=5)
    assert runner.stop() == 0


def test_an_idle_worker_claims_on_its_listen_connection(
    start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The idle-latency path: the listener thread claims on the connection that received the
    # NOTIFY and hands the message to a handler thread itself.
    claimed_in: list[str] = []
    original = Fetcher.claim

    def spy(self: Fetcher, queue: str, want: int) -> list[Message]:
        batch = original(self, queue, want)
        if batch:
            claimed_in.append(threading.current_thread().name)
        return batch

    monkeypatch.setattr(Fetcher, "claim", spy)
    runner = start_worker(poll_interval=30)
    time.sleep(0.2)
    msg = django_pgqueue.enqueue("tests.echo", {"hi": 1})
    wait_for(lambda: archived(msg.id), timeout=2)
    assert claimed_in == ["listener"]
    assert runner.stop() == 0


def test_a_failing_claim_in_the_listener_falls_back_to_the_main_loop(
    start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A bug in the listener's claim must not cost the worker its listener or the message.
    original = Fetcher.claim

    def broken_in_listener(self: Fetcher, queue: str, want: int) -> list[Message]:
        if threading.current_thread().name == "listener":
            raise RuntimeError("bug in the fast path")
        return original(self, queue, want)

    monkeypatch.setattr(Fetcher, "claim", broken_in_listener)
    runner = start_worker(poll_interval=30)
    time.sleep(0.2)
    first = django_pgqueue.enqueue("tests.echo", {"n": 1})
    wait_for(lambda: archived(first.id), timeout=2)
    assert "Claiming on the LISTEN connection failed" in caplog.text
    assert runner.worker.listener is not None and runner.worker.listener.is_alive()
    second = django_pgqueue.enqueue("tests.echo", {"n": 2})
    wait_for(lambda: archived(second.id), timeout=2)
    assert runner.stop() == 0


def test_a_delayed_message_notified_with_a_ready_one_runs_when_due(
    start_worker: StartWorker,
) -> None:
    # One NOTIFY for both (same transaction): the listener claims the ready one and must
    # still have the main loop wake up for the delayed one, not wait for the 30 s poll.
    runner = start_worker(poll_interval=30)
    time.sleep(0.2)
    with transaction.atomic():
        later = django_pgqueue.enqueue(
            "tests.echo", {"later": True}, run_after=dt.timedelta(seconds=0.7)
        )
        ready = django_pgqueue.enqueue("tests.echo", {"now": True})
    wait_for(lambda: archived(ready.id), timeout=2)
    row = wait_for(lambda: archived(later.id), timeout=3)
    assert row.finished_at >= row.enqueued_at + dt.timedelta(seconds=0.7)
    assert runner.stop() == 0


def test_ready_messages_cost_no_lookup_of_the_next_due_time(
    start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under a long-running transaction elsewhere that lookup walks every recently leased
    # message's index entry: it runs when something scheduled came, not after every claim.
    looked_up: list[list[str]] = []
    original = Fetcher.seconds_to_next_due

    def spy(self: Fetcher, queues: list[str]) -> float | None:
        looked_up.append(list(queues))
        return original(self, queues)

    monkeypatch.setattr(Fetcher, "seconds_to_next_due", spy)
    runner = start_worker(poll_interval=30, queues=["ready-only"])
    time.sleep(0.3)
    looked_up.clear()  # the start-up lookup
    for n in range(5):
        msg = django_pgqueue.enqueue("tests.echo", {"n": n}, queue="ready-only")
        wait_for(lambda: archived(msg.id), timeout=2)  # noqa: B023
    assert looked_up == []
    later = django_pgqueue.enqueue(
        "tests.echo", {"later": True}, queue="ready-only", run_after=dt.timedelta(seconds=0.5)
    )
    row = wait_for(lambda: archived(later.id), timeout=3)
    assert row.finished_at >= row.enqueued_at + dt.timedelta(seconds=0.5)
    assert ["ready-only"] in looked_up
    assert runner.stop() == 0


def test_poll_only_mode_finds_messages_without_notify(start_worker: StartWorker) -> None:
    runner = start_worker(listen=False, poll_interval=0.2)
    assert runner.worker.listener is None
    msg = django_pgqueue.enqueue("tests.echo", {"polled": True})
    wait_for(lambda: archived(msg.id), timeout=3)
    assert runner.stop() == 0


def test_wakes_when_a_scheduled_message_falls_due(start_worker: StartWorker) -> None:
    runner = start_worker(poll_interval=30)
    msg = django_pgqueue.enqueue("tests.echo", {"later": True}, run_after=dt.timedelta(seconds=0.7))
    time.sleep(0.3)
    assert archived(msg.id) is None
    row = wait_for(lambda: archived(msg.id), timeout=3)
    assert row.finished_at >= row.enqueued_at + dt.timedelta(seconds=0.7)
    runner.stop()


def test_heartbeat_row_and_health_file_live_while_running(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    health = tmp_path / "health.json"
    runner = start_worker(worker_id="hb-test", healthcheck_file=str(health), queues=["q1"])
    row = WorkerHeartbeat.objects.get(worker_id="hb-test")
    assert row.queues == ["q1"] and row.concurrency == runner.worker.concurrency
    assert set(row.stats) >= {"processed", "failed", "retried", "dead", "in_flight", "rate"}
    assert health.exists()
    assert runner.stop() == 0
    assert not WorkerHeartbeat.objects.filter(worker_id="hb-test").exists()
    assert not health.exists()


def test_heartbeat_extends_the_lease_of_a_long_handler(start_worker: StartWorker) -> None:
    # Lease of 0.6 s, handler of 1.5 s: without heartbeats the lease would lapse mid-run.
    msg = django_pgqueue.enqueue("tests.sleep", {"seconds": 1.5})
    runner = start_worker(visibility_timeout=0.6)
    row = wait_for(lambda: archived(msg.id), timeout=5)
    assert row.attempts == 1
    runner.stop()


def test_context_extend_lease_moves_the_expiry(start_worker: StartWorker) -> None:
    msg = django_pgqueue.enqueue("tests.extend", None)
    start_worker(burst=True).join()
    row = archived(msg.id)
    assert row is not None and row.result is True


def test_queue_filters_and_paused_queues(start_worker: StartWorker) -> None:
    QueueStateFactory(name="paused", paused=True)
    wanted = django_pgqueue.enqueue("tests.echo", 1, queue="wanted")
    other = django_pgqueue.enqueue("tests.echo", 2, queue="other")
    skipped = django_pgqueue.enqueue("tests.echo", 3, queue="skipped")
    held = django_pgqueue.enqueue("tests.echo", 4, queue="paused")
    start_worker(burst=True, queues=["wanted", "skipped"], exclude_queues=["skipped"]).join()
    assert archived(wanted.id) is not None
    assert archived(other.id) is None and archived(skipped.id) is None
    start_worker(burst=True, exclude_queues=["skipped"]).join()
    assert archived(other.id) is not None
    assert archived(skipped.id) is None and archived(held.id) is None


def test_max_messages_stops_after_that_many(start_worker: StartWorker) -> None:
    for n in range(10):
        django_pgqueue.enqueue("tests.echo", n)
    runner = start_worker(max_messages=4, batch_size=100)
    assert runner.join() == 0
    assert ArchivedMessage.objects.count() == 4
    assert Message.objects.count() == 6


def test_stale_ready_messages_are_warned_about(
    start_worker: StartWorker, caplog: pytest.LogCaptureFixture
) -> None:
    django_pgqueue.enqueue("tests.echo", 1, queue="unserved")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgqueue_message SET available_at = now() - interval '10 seconds'")
    caplog.set_level(logging.WARNING, logger="django_pgqueue")
    with override_settings(PGQUEUE={"STALE_READY_WARNING": 0.3}):
        runner = start_worker(queues=["served"])
        wait_for(lambda: "'unserved' have waited" in caplog.text, timeout=5)
        runner.stop()


def test_graceful_stop_releases_messages_not_yet_started(start_worker: StartWorker) -> None:
    slow = [django_pgqueue.enqueue("tests.sleep", {"seconds": 0.5}) for _ in range(5)]
    runner = start_worker(concurrency=1, batch_size=5)
    wait_for(lambda: runner.worker.executor.running())
    assert runner.stop() == 0
    done = [m.id for m in slow if archived(m.id)]
    assert len(done) == 1
    waiting = Message.objects.filter(id__in=[m.id for m in slow])
    assert waiting.count() == 4
    assert all(m.attempts == 0 and m.lease_token is None for m in waiting)


def test_forced_stop_releases_running_messages_and_exits_non_zero(
    start_worker: StartWorker,
) -> None:
    msg = django_pgqueue.enqueue("tests.sleep", {"seconds": 5})
    runner = start_worker(grace_period=30)
    wait_for(lambda: runner.worker.executor.running())
    runner.worker.request_stop()
    runner.worker.request_stop()  # the second signal
    assert runner.join() == 1
    row = Message.objects.get(id=msg.id)
    assert row.lease_token is None and row.attempts == 0


def test_grace_period_expiry_releases_and_exits_non_zero(start_worker: StartWorker) -> None:
    msg = django_pgqueue.enqueue("tests.sleep", {"seconds": 5})
    runner = start_worker(grace_period=0.3)
    wait_for(lambda: runner.worker.executor.running())
    started = time.monotonic()
    assert runner.stop() == 1
    assert time.monotonic() - started < 2
    assert Message.objects.get(id=msg.id).lease_token is None


def test_call_command_runs_a_burst(capsys: pytest.CaptureFixture[str]) -> None:
    msg = django_pgqueue.enqueue("tests.echo", {"via": "call_command"})
    call_command("pgq_worker", burst=True, concurrency=2, queues=["default"])
    assert archived(msg.id) is not None


def test_the_worker_leaves_the_callers_connection_with_djangos_settings() -> None:
    # The worker's claim connection keeps the claim's settings for its session; the thread
    # that ran the worker must not inherit them (synchronous_commit = off, enable_sort = off).
    django_pgqueue.enqueue("tests.echo", {"via": "call_command"})
    call_command("pgq_worker", burst=True, queues=["default"])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('enable_sort'), current_setting('synchronous_commit')"
        )
        assert cursor.fetchone() == ("on", "on")


def test_lost_lease_result_is_fenced_off(start_worker: StartWorker) -> None:
    # The handler outlives its lease; another claim takes the message meanwhile: the first
    # run's completion must not archive it.
    msg = django_pgqueue.enqueue("tests.sleep", {"seconds": 1.0, "only_attempts": [1]})
    runner = start_worker(concurrency=1, visibility_timeout=30)
    wait_for(lambda: runner.worker.executor.running())
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_message SET lease_token = gen_random_uuid() WHERE id = %s", [msg.id]
        )
    time.sleep(1.3)
    assert archived(msg.id) is None
    runner.stop()


@override_settings(PGQUEUE={"BACKOFF_BASE": 0.3, "BACKOFF_JITTER": 0.0})
def test_a_retry_wakes_the_worker_when_due_without_a_poll(start_worker: StartWorker) -> None:
    msg = django_pgqueue.enqueue("tests.fail", None, max_attempts=2)
    runner = start_worker(poll_interval=30)
    row = wait_for(lambda: dead(msg.id), timeout=5)
    assert row.attempts == 2
    runner.stop()


def test_a_deaf_listener_is_found_by_the_probe_and_reconnected(
    start_worker: StartWorker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="django_pgqueue")
    runner = start_worker(poll_interval=30)
    listener = runner.worker.listener
    assert listener is not None
    listener.on_probe = lambda payload: None  # the probe goes unheard
    runner.worker.probe.run()
    runner.worker.probe.run()
    wait_for(lambda: "missed its probe" in caplog.text)
    wait_for(lambda: "LISTEN connection back" in caplog.text)
    msg = django_pgqueue.enqueue("tests.echo", "still hears")
    wait_for(lambda: archived(msg.id), timeout=3)
    runner.stop()


def test_status_line_reports_rates_and_counters(
    start_worker: StartWorker, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_pgqueue.worker import chores

    monkeypatch.setattr(chores, "STATUS_INTERVAL", 0.2)
    caplog.set_level(logging.INFO, logger="django_pgqueue")
    django_pgqueue.enqueue("tests.echo", 1)
    runner = start_worker()
    wait_for(lambda: "1 processed, 0 retried, 0 dead" in caplog.text)
    assert "processed/s" in caplog.text
    runner.stop()


def test_async_handler_can_extend_its_lease(start_worker: StartWorker) -> None:
    msg = django_pgqueue.enqueue("tests.async-extend", None)
    start_worker(burst=True).join()
    row = archived(msg.id)
    assert row is not None and row.result is True


def test_call_command_reports_bad_options_as_command_errors() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="excluded"):
        call_command("pgq_worker", burst=True, queues=["a"], exclude_queues=["a"])


def test_call_command_poll_only_burst_with_max_messages() -> None:
    for n in range(3):
        django_pgqueue.enqueue("tests.echo", n, queue="cc")
    call_command("pgq_worker", queues=["cc"], listen=False, max_messages=2, batch_size=1)
    assert ArchivedMessage.objects.filter(queue="cc").count() == 2


def test_a_restarted_worker_id_registers_afresh(start_worker: StartWorker) -> None:
    from tests.factories import WorkerHeartbeatFactory

    old = WorkerHeartbeatFactory(worker_id="same-id")
    WorkerHeartbeat.objects.filter(pk=old.pk).update(
        started_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    )
    runner = start_worker(worker_id="same-id")
    row = WorkerHeartbeat.objects.get(worker_id="same-id")
    assert row.started_at.year > 2020 and row.pid is not None
    runner.stop()


def test_too_many_stuck_threads_stop_the_worker_non_zero(start_worker: StartWorker) -> None:
    # Each 2 s sleep outlives its 0.3 s timeout; a thread cannot be killed, so once more
    # threads are stuck than --concurrency allows, only a restart helps.
    ids = [
        django_pgqueue.enqueue("tests.timeout", {"seconds": 2}, max_attempts=1).id for _ in range(3)
    ]
    runner = start_worker(concurrency=1, batch_size=1)
    assert runner.join(timeout=10) == 1
    # Two timed out before the stop; the third may have started (and timed out) meanwhile.
    assert DeadMessage.objects.filter(message_id__in=ids, reason="timeout").count() >= 2
    assert not Message.objects.filter(id__in=ids, lease_token__isnull=False).exists()
