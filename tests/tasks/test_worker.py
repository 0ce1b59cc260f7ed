"""End to end: tasks enqueued through django.tasks, run by a real ``pgq_worker`` subprocess.

The worker is ``python -m django pgq_worker --burst`` with ``tests.settings``, pointed at the
test database; it autodiscovers ``tests/taskapp/tasks.py``, whose signal receivers log every
signal they see (in the worker, and in this process for ``task_enqueued``) to a file.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from django_pgqueue.models import ArchivedMessage, DeadMessage, Message
from django_pgqueue.tasks import PgQueueBackend, TaskRejected, TaskTimeout
from django_pgqueue.tasks.framework import TaskResultStatus
from tests.dsn import database_url
from tests.taskapp import tasks as t
from tests.tasks import undiscovered

REPO = Path(settings.REPO_DIR)
WORKER_COMMAND = REPO / "django_pgqueue" / "management" / "commands" / "pgq_worker.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not WORKER_COMMAND.exists(), reason="the pgq_worker management command is not there"
    ),
]

BACKEND = f"{PgQueueBackend.__module__}.{PgQueueBackend.__qualname__}"


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_worker(signal_log: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url(),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "example_project")]),
        "PGQ_TASKS_SIGNAL_LOG": str(signal_log),
    }
    command = [
        sys.executable,
        "-m",
        "django",
        "pgq_worker",
        "--burst",
        "--no-listen",
        "--queue",
        "default",
        "--queue",
        "tasks-other",
        *extra,
    ]
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done


def test_results_retries_errors_async_and_signals(signal_log: Path) -> None:
    ok = t.add.enqueue(2, 3)
    failing = t.always_fails.enqueue("broken on purpose")  # max_attempts=2
    flaky = t.flaky.enqueue(succeed_on=3)  # max_attempts=3: fails twice, then succeeds
    async_ok = t.async_add.enqueue(4, 5)
    async_retry = t.async_flaky.enqueue()
    slow = t.too_slow.enqueue()  # timeout=1, max_attempts=1
    unknown = undiscovered.never_registered_in_the_worker.enqueue()
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = t.add.enqueue(100, 100)
        raise RuntimeError("roll back")

    run_worker(signal_log, "--concurrency", "2")

    ok.refresh()
    assert ok.status == TaskResultStatus.SUCCESSFUL and ok.return_value == 5
    assert ok.attempts == 1 and ok.errors == []
    assert ok.worker_ids[0].count(":") >= 2  # host:pid:random, the worker's id
    assert ok.started_at is not None and ok.finished_at is not None
    assert ok.enqueued_at <= ok.started_at <= ok.finished_at
    assert ArchivedMessage.objects.get(message_id=int(ok.id)).result == 5

    failing.refresh()
    assert failing.status == TaskResultStatus.FAILED
    assert failing.attempts == 2 and len(failing.errors) == 2
    assert {e.exception_class for e in failing.errors} == {ValueError}
    assert all("broken on purpose" in e.traceback for e in failing.errors)
    assert "Traceback (most recent call last)" in failing.errors[-1].traceback
    assert DeadMessage.objects.get(message_id=int(failing.id)).reason == "error"
    with pytest.raises(ValueError, match="Task failed"):
        _ = failing.return_value

    flaky.refresh()
    assert flaky.status == TaskResultStatus.SUCCESSFUL
    assert flaky.return_value == {
        "attempt": 3,
        "attempts": 3,
        "errors": ["builtins.RuntimeError", "builtins.RuntimeError"],
        "status": "RUNNING",
    }
    assert flaky.attempts == 3 and len(flaky.errors) == 2
    assert flaky.started_at is not None and flaky.last_attempted_at is not None
    assert flaky.started_at < flaky.last_attempted_at  # first attempt vs the third

    async_ok.refresh()
    assert async_ok.status == TaskResultStatus.SUCCESSFUL
    assert async_ok.return_value == {"sum": 9}
    async_retry.refresh()
    assert async_retry.status == TaskResultStatus.SUCCESSFUL and async_retry.return_value == 2
    assert [e.exception_class for e in async_retry.errors] == [KeyError]

    slow.refresh()
    assert slow.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in slow.errors] == [TaskTimeout]
    assert DeadMessage.objects.get(message_id=int(slow.id)).reason == "timeout"

    unknown.refresh()
    assert unknown.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in unknown.errors] == [TaskRejected]
    assert DeadMessage.objects.get(message_id=int(unknown.id)).reason == "rejected"

    assert not Message.objects.exists()
    log = read_log(signal_log)
    assert {line["sender"] for line in log} == {BACKEND}
    by_id: dict[str, list[tuple[str, str, int]]] = {}
    for line in log:
        by_id.setdefault(line["id"], []).append((line["signal"], line["status"], line["attempts"]))
    assert rolled_back.id not in by_id
    assert by_id[ok.id] == [
        ("enqueued", "READY", 0),
        ("started", "RUNNING", 1),
        ("finished", "SUCCESSFUL", 1),
    ]
    # task_finished once, for the final outcome; task_started on every attempt.
    assert by_id[failing.id] == [
        ("enqueued", "READY", 0),
        ("started", "RUNNING", 1),
        ("started", "RUNNING", 2),
        ("finished", "FAILED", 2),
    ]
    assert by_id[flaky.id] == [
        ("enqueued", "READY", 0),
        ("started", "RUNNING", 1),
        ("started", "RUNNING", 2),
        ("started", "RUNNING", 3),
        ("finished", "SUCCESSFUL", 3),
    ]
    assert by_id[async_retry.id][-1] == ("finished", "SUCCESSFUL", 2)
    # A last attempt that timed out never raised in the task function: the worker's
    # dead-letter hook sends task_finished for it.
    assert by_id[slow.id] == [
        ("enqueued", "READY", 0),
        ("started", "RUNNING", 1),
        ("finished", "FAILED", 1),
    ]


def test_priority_order_and_run_after(signal_log: Path) -> None:
    later = t.stamp.using(run_after=timezone.now() + dt.timedelta(seconds=4)).enqueue("later")
    low = t.stamp.using(priority=-10).enqueue("low")
    mid = t.stamp.enqueue("mid")
    high = t.stamp.using(priority=50).enqueue("high")
    top = t.stamp.using(priority=100).enqueue("top")

    # One handler and one message per lease: execution order = claim order.
    run_worker(signal_log, "--concurrency", "1", "--batch-size", "1")

    ran = [t.stamp.get_result(r.id) for r in (top, high, mid, low)]
    assert all(r.status == TaskResultStatus.SUCCESSFUL for r in ran)
    order = sorted(ran, key=lambda r: r.return_value["ns"])
    assert [r.return_value["label"] for r in order] == ["top", "high", "mid", "low"]

    due = later.task.run_after
    assert due is not None
    deferred = t.stamp.get_result(later.id)
    if timezone.now() < due - dt.timedelta(seconds=0.5):  # the burst surely ended before it
        assert deferred.status == TaskResultStatus.READY  # not due: the burst left it
        assert deferred.task.run_after == due
    time.sleep(max(0.0, (due - timezone.now()).total_seconds()) + 0.2)
    run_worker(signal_log, "--concurrency", "1")
    later.refresh()
    assert later.status == TaskResultStatus.SUCCESSFUL
    # Never started before it was due (the lease time is database time).
    assert later.started_at is not None and later.started_at >= due
