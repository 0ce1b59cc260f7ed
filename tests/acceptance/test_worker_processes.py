"""The issue's acceptance tests: real worker processes, real signals, real faults."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import django_pgqueue
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message
from tests.testapp.models import Effect
from tests.worker.conftest import wait_for

from .conftest import WorkerProcess, database_closed, terminate_backends

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
Spawn = Callable[..., WorkerProcess]


def leased(message_id: int) -> bool:
    return Message.objects.filter(id=message_id, lease_token__isnull=False).exists()


def archived(message_id: int) -> ArchivedMessage | None:
    return ArchivedMessage.objects.filter(message_id=message_id).first()


@pytest.mark.chaos
def test_sigkill_mid_handler_is_redelivered_after_the_lease_expires(
    spawn_worker: Spawn, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    msg = django_pgqueue.enqueue(
        "tests.sleep", {"seconds": 60, "started_file": str(started), "first_run_only": True}
    )
    first = spawn_worker("--visibility-timeout", "1", "--poll-interval", "0.5").ready()
    wait_for(lambda: leased(msg.id))
    time.sleep(0.3)  # the handler is sleeping now
    first.signal(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    assert archived(msg.id) is None
    second = spawn_worker("--visibility-timeout", "1", "--poll-interval", "0.5").ready()
    row = wait_for(lambda: archived(msg.id), timeout=20)
    # Run twice, one attempt: the killed run was not alone in its worker (nothing tells it
    # from a batch-mate's crash), so its expired lease gave the attempt back.
    assert row.attempts == 1
    assert row.worker_id == second.worker_id
    assert row.result["attempt"] == 1
    second.wait_for_line(rf"Message {msg.id} .*redelivered")
    second.signal(signal.SIGTERM)
    assert second.wait() == 0


def test_sigterm_while_busy_drains_and_exits_zero(spawn_worker: Spawn, tmp_path: Path) -> None:
    started = tmp_path / "started"
    msg = django_pgqueue.enqueue("tests.sleep", {"seconds": 1.5, "started_file": str(started)})
    worker = spawn_worker().ready()
    # Leased is not yet started: a SIGTERM in between releases it as not started (exit 0).
    wait_for(started.exists)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    row = archived(msg.id)
    assert row is not None and row.attempts == 1


def test_sigterm_while_idle_exits_within_a_second(spawn_worker: Spawn) -> None:
    worker = spawn_worker().ready()
    time.sleep(0.3)
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert time.monotonic() - started < 1.0


def test_second_sigterm_releases_running_messages_and_exits_non_zero(
    spawn_worker: Spawn, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    msg = django_pgqueue.enqueue("tests.sleep", {"seconds": 30, "started_file": str(started)})
    worker = spawn_worker("--grace-period", "60").ready()
    # Running, not only leased: a SIGTERM before the handler starts releases it at once.
    wait_for(started.exists)
    worker.signal(signal.SIGTERM)
    worker.wait_for_line("SIGTERM: finishing")
    worker.signal(signal.SIGTERM)
    assert worker.wait() != 0
    row = Message.objects.get(id=msg.id)
    assert row.lease_token is None and row.attempts == 0


@pytest.mark.chaos
def test_killed_listen_connection_recovers_and_catches_up(
    spawn_worker: Spawn, admin_conn: psycopg.Connection[object]
) -> None:
    worker = spawn_worker("--poll-interval", "30").ready()
    assert terminate_backends(admin_conn, worker.worker_id, "listener") == 1
    # Enqueued during the outage: the NOTIFY is lost, the catch-up fetch finds them.
    ids = [django_pgqueue.enqueue("tests.echo", n).id for n in range(5)]
    wait_for(lambda: ArchivedMessage.objects.filter(message_id__in=ids).count() == 5, timeout=10)
    worker.wait_for_line("LISTEN connection lost")
    worker.wait_for_line("LISTEN connection back")
    # And NOTIFY wakes it again afterwards (the poll interval is 30 s).
    later = django_pgqueue.enqueue("tests.echo", "after")
    wait_for(lambda: archived(later.id), timeout=5)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


@pytest.mark.chaos
def test_killed_query_connections_mid_handler_reconnect_and_go_on(
    spawn_worker: Spawn, admin_conn: psycopg.Connection[object]
) -> None:
    msg = django_pgqueue.enqueue("tests.sleep", {"seconds": 1.0})
    worker = spawn_worker("--poll-interval", "30").ready()
    wait_for(lambda: leased(msg.id))
    killed = terminate_backends(admin_conn, worker.worker_id, "MainThread")
    killed += terminate_backends(admin_conn, worker.worker_id, "completer")
    assert killed >= 1
    row = wait_for(lambda: archived(msg.id), timeout=15)
    assert row.attempts == 1
    after = django_pgqueue.enqueue("tests.echo", "after the outage")
    wait_for(lambda: archived(after.id), timeout=10)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    # One line per connection and outage, not one per retry.
    assert 1 <= worker.output.count("Database unavailable") <= 2, worker.output


def test_always_raising_handler_ends_dead_while_others_flow(spawn_worker: Spawn) -> None:
    bad = django_pgqueue.enqueue("tests.fail", {"n": 1}, max_attempts=3)
    good = [django_pgqueue.enqueue("tests.echo", n).id for n in range(50)]
    worker = spawn_worker("--poll-interval", "0.5").ready()
    wait_for(lambda: ArchivedMessage.objects.filter(message_id__in=good).count() == 50)
    dead = wait_for(lambda: DeadMessage.objects.filter(message_id=bad.id).first(), timeout=20)
    assert dead.reason == "error" and dead.attempts == 3 and len(dead.errors) == 3
    worker.wait_for_line(rf"Message {bad.id} .*dead-lettered")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_four_workers_process_each_message_exactly_once(spawn_worker: Spawn) -> None:
    total = 8000
    django_pgqueue.enqueue_many("tests.effect", [{"n": n} for n in range(total)])
    workers = [
        spawn_worker("--burst", "--concurrency", "4", "--batch-size", "50") for _ in range(4)
    ]
    for worker in workers:
        assert worker.wait(90) == 0, worker.output
    assert Effect.objects.count() == total  # UNIQUE(message_id): a double run would have failed
    assert ArchivedMessage.objects.count() == total
    assert not Message.objects.exists() and not DeadMessage.objects.exists()
    assert Effect.objects.values("worker_pid").distinct().count() >= 2


@pytest.mark.chaos
def test_database_outage_is_ridden_out_without_a_log_storm(
    spawn_worker: Spawn, admin_conn: psycopg.Connection[object]
) -> None:
    worker = spawn_worker("--poll-interval", "0.2").ready()
    with database_closed(admin_conn, worker.worker_id):
        time.sleep(2.5)
        assert worker.proc.poll() is None  # still running, no crash loop
    msg = django_pgqueue.enqueue("tests.echo", "after the outage")
    wait_for(lambda: archived(msg.id), timeout=15)
    worker.wait_for_line("Database reachable again")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    # One line per thread and outage (main, completer, listener), not one per retry.
    assert worker.output.count("Database unavailable") <= 3, worker.output
    assert worker.output.count("LISTEN connection") <= 3, worker.output
    assert "Traceback" not in worker.output
