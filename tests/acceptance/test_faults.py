"""The fault matrix beyond tests/acceptance/test_worker_processes.py: a kill in the middle of
an ack, a restart of the database itself (a private cluster), values no enqueue writes but a
table may hold. Real worker processes throughout."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import django_pgqueue
from django_pgqueue.core._validation import MAX_PRIORITY
from django_pgqueue.models import ArchivedMessage, Message
from tests.conftest import connection_kwargs
from tests.worker.conftest import wait_for

from .cluster import PrivateCluster
from .conftest import WorkerProcess, terminate_backends

pytestmark = [
    pytest.mark.slow,
    pytest.mark.chaos,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
]
Spawn = Callable[..., WorkerProcess]


def waiting_on_a_lock(worker: WorkerProcess, role: str) -> bool:
    # A connection of its own: pg_stat_activity is read once per transaction. Only this test
    # database: another checkout's tests may run a worker of the same name on the server.
    with psycopg.connect(**connection_kwargs(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            " AND wait_event_type = 'Lock' AND datname = current_database()",
            [f"pgq_worker:{worker.worker_id}:{role}"[:63]],
        ).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("ack", ["commits after the kill", "dies with its connection"])
def test_sigkill_mid_ack_leaves_the_message_archived_exactly_once(
    spawn_worker: Spawn, admin_conn: psycopg.Connection[Any], tmp_path: Path, ack: str
) -> None:
    started = tmp_path / "started"
    msg = django_pgqueue.enqueue("tests.sleep", {"seconds": 0.3, "started_file": str(started)})
    worker = spawn_worker("--poll-interval", "0.2").ready()
    wait_for(started.exists)
    # Hold the row: the handler returns, and the completer's archive statement waits here.
    with psycopg.connect(**connection_kwargs()) as locker:
        locker.execute("SELECT 1 FROM pgqueue_message WHERE id = %s FOR UPDATE", [msg.id])
        wait_for(lambda: waiting_on_a_lock(worker, "completer"), timeout=10)
        worker.signal(signal.SIGKILL)
        assert worker.wait() == -signal.SIGKILL
        if ack == "dies with its connection":
            assert terminate_backends(admin_conn, worker.worker_id, "completer") == 1
        locker.rollback()
    if ack == "commits after the kill":
        # The server finishes the statement it was given: archived, never run again.
        row = wait_for(lambda: ArchivedMessage.objects.filter(message_id=msg.id).first())
    else:
        # Nothing was written: the lease expires (now, here) and another worker runs it again;
        # its first run was beside nothing else, not alone: the attempt is given back.
        Message.objects.filter(id=msg.id).update(
            available_at=Message.objects.get(id=msg.id).enqueued_at
        )
        started.unlink()
        second = spawn_worker("--poll-interval", "0.2").ready()
        row = wait_for(lambda: ArchivedMessage.objects.filter(message_id=msg.id).first())
        assert started.exists()
        assert row.worker_id == second.worker_id
    assert row.attempts == 1
    time.sleep(0.5)
    assert not Message.objects.filter(id=msg.id).exists()
    assert ArchivedMessage.objects.filter(message_id=msg.id).count() == 1


def insert(conn: psycopg.Connection[Any], task: str, payloads: list[Any]) -> list[int]:
    """Committed messages, written as any client of the database would."""
    rows = conn.execute(
        "INSERT INTO pgqueue_message (queue, task, payload) "
        "SELECT 'default', %s, p::jsonb FROM unnest(%s::text[]) AS p RETURNING id",
        [task, [json.dumps(p) for p in payloads]],
    ).fetchall()
    return [r[0] for r in rows]


def count(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_database_restart_loses_no_message_and_the_worker_rides_it_out(
    spawn_worker: Spawn, private_cluster: PrivateCluster, cluster_db: Any, mode: str
) -> None:
    """``fast``: a clean restart; ``immediate``: a crash of the server (what an asynchronous
    commit had not flushed is forgotten: those messages run again, none is lost)."""
    worker = spawn_worker(
        "--poll-interval", "0.2", "--visibility-timeout", "10", database=private_cluster.url
    ).ready()
    ids = insert(cluster_db, "tests.sleep", [{"seconds": 0.01} for _ in range(300)])
    wait_for(lambda: count(cluster_db, "pgqueue_archive") >= 30, timeout=30)
    private_cluster.restart(mode)
    with private_cluster.connect() as conn:
        ids += insert(conn, "tests.echo", list(range(100)))

        def settled() -> bool:
            return count(conn, "pgqueue_message") == 0

        wait_for(settled, timeout=90, interval=0.2)
        assert count(conn, "pgqueue_dead") == 0
        archived = conn.execute("SELECT message_id FROM pgqueue_archive").fetchall()
        assert sorted(r[0] for r in archived) == sorted(ids)
    assert worker.proc.poll() is None, worker.output
    worker.wait_for_line("Database reachable again")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    assert "Traceback" not in worker.output


@pytest.mark.parametrize("queues", [[], ["--queue", "default"]])
def test_far_future_and_extreme_values_already_in_the_table_break_no_worker(
    spawn_worker: Spawn, admin_conn: psycopg.Connection[Any], queues: list[str]
) -> None:
    """Rows no enqueue writes (issue #25, item 5), written by SQL or an older version: the
    worker serving their queue keeps serving it."""
    admin_conn.execute(
        "INSERT INTO pgqueue_message (queue, task, payload, available_at, enqueued_at) VALUES "
        "('default', 'tests.echo', '1', 'infinity', '-infinity'), "
        "('default', 'tests.echo', '2', '275000-01-01', now()), "
        "('later', 'tests.echo', '3', '9999-12-31 23:59:59.999999+00', now())"
    )
    admin_conn.execute(
        "INSERT INTO pgqueue_message (queue, task, payload, priority, max_attempts, attempts) "
        "VALUES ('default', 'tests.echo', '4', %s, 2147483647, 2147483646)",
        [MAX_PRIORITY],
    )
    worker = spawn_worker("--poll-interval", "0.2", *queues).ready()
    msg = django_pgqueue.enqueue("tests.echo", "ordinary")
    wait_for(lambda: ArchivedMessage.objects.filter(message_id=msg.id).exists(), timeout=15)
    time.sleep(1.5)  # several polls, each looking for the next due message
    assert worker.proc.poll() is None, worker.output
    assert Message.objects.count() == 3  # the far-future ones wait; the extreme one ran
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    assert "Traceback" not in worker.output
