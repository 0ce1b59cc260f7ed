"""Real ``pgq_worker`` processes: every internal thread supervised, listener probes private.

A fault is injected into one thread (``faultapp/apps.py``: the worker runs with
``tests.worker.fault_settings``); the worker must log it with its traceback, release what it
holds and exit 1, never run on half-alive.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

import django_pgqueue
from django_pgqueue.models import ArchivedMessage, Message, WorkerHeartbeat
from tests.acceptance.conftest import WorkerProcess, spawn_worker  # noqa: F401 (fixture)

from .conftest import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
Spawn = Callable[..., WorkerProcess]


def leased(message_id: int) -> bool:
    return Message.objects.filter(id=message_id, lease_token__isnull=False).exists()


def faulty_worker(spawn: Spawn, thread: str, trigger: Path) -> WorkerProcess:
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.worker.fault_settings",
        "PGQ_FAULT": thread,
        "PGQ_FAULT_TRIGGER": str(trigger),
    }
    args = ("--poll-interval", "0.3", "--visibility-timeout", "3", "--grace-period", "5")
    return spawn(*args, env=env).ready()


def assert_stopped_on_the_fault(worker: WorkerProcess, thread: str) -> None:
    """Exit 1, the fault logged with its traceback, the worker unregistered."""
    assert worker.wait(timeout=20) == 1
    name = "completer (heartbeat)" if thread == "heartbeat" else thread
    name = {"handler thread": "handler-", "async loop": "async-handlers"}.get(name, name)
    assert re.search(rf"CRITICAL .*Internal error in the {re.escape(name)}", worker.output)
    assert "Traceback (most recent call last)" in worker.output
    assert f"RuntimeError: injected fault in the {thread}" in worker.output
    assert "internal error in the" in worker.output  # the command's closing error
    assert not WorkerHeartbeat.objects.filter(worker_id=worker.worker_id).exists()


def test_a_fault_in_the_main_loop_drains_and_exits_1(spawn_worker: Spawn, tmp_path: Path) -> None:  # noqa: F811
    trigger, started = tmp_path / "trigger", tmp_path / "started"
    worker = faulty_worker(spawn_worker, "main loop", trigger)
    msg = django_pgqueue.enqueue("tests.sleep", {"seconds": 1, "started_file": str(started)})
    wait_for(started.exists)
    trigger.touch()
    assert_stopped_on_the_fault(worker, "main loop")
    # The completer lived on: the running handler finished and was archived.
    row = ArchivedMessage.objects.get(message_id=msg.id)
    assert row.attempts == 1


@pytest.mark.parametrize("thread", ["completer", "heartbeat"])
def test_a_fault_in_the_completer_releases_at_once_and_exits_1(
    spawn_worker: Spawn,  # noqa: F811
    tmp_path: Path,
    thread: str,
) -> None:
    trigger, started = tmp_path / "trigger", tmp_path / "started"
    worker = faulty_worker(spawn_worker, thread, trigger)
    msg = django_pgqueue.enqueue("tests.sleep", {"seconds": 3, "started_file": str(started)})
    wait_for(started.exists)
    trigger.touch()
    assert_stopped_on_the_fault(worker, thread)
    # Nothing could be written any more: the lease was released, its attempt counted.
    row = Message.objects.get(id=msg.id)
    assert row.lease_token is None and row.attempts == 1
    assert "Released 1 unfinished messages" in worker.output


@pytest.mark.parametrize(
    ("thread", "task"),
    [
        ("listener", "tests.echo"),
        ("handler thread", "tests.echo"),
        ("async loop", "tests.async-echo-any"),
    ],
)
def test_a_fault_in_another_thread_stops_the_worker_with_exit_1(
    spawn_worker: Spawn,  # noqa: F811
    tmp_path: Path,
    thread: str,
    task: str,
) -> None:
    trigger = tmp_path / "trigger"
    worker = faulty_worker(spawn_worker, thread, trigger)
    trigger.touch()
    msg = django_pgqueue.enqueue(task, "hello")
    assert_stopped_on_the_fault(worker, thread)
    # Never started: given back with its attempt not counted (or run, if it was claimed by
    # a thread that still worked), never left leased.
    assert not leased(msg.id)
    live = Message.objects.filter(id=msg.id).first()
    assert live is None or live.attempts == 0
