"""The registry handler each task gets, run in process on a real leased message.

(End-to-end runs through a real ``pgq_worker`` subprocess are in test_worker.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from django_pgqueue.core import transitions
from django_pgqueue.core._registry import registry
from django_pgqueue.models import Message
from django_pgqueue.tasks import PgQueueBackend
from django_pgqueue.tasks.framework import TaskResultStatus, task_finished, task_started
from django_pgqueue.worker.context import MessageContext
from tests.taskapp import tasks as t

pytestmark = pytest.mark.django_db


@pytest.fixture
def signals() -> Iterator[list[tuple[str, Any, Any]]]:
    seen: list[tuple[str, Any, Any]] = []

    def started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(("started", sender, task_result))

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(("finished", sender, task_result))

    task_started.connect(started, weak=False)
    task_finished.connect(finished, weak=False)
    yield seen
    task_started.disconnect(started)
    task_finished.disconnect(finished)


def run(queue: str = "default", abandoned: bool = False) -> tuple[Message, Any]:
    """Lease the next message and run its handler the way the worker does (``abandoned``:
    as if the worker had given the run up, its timeout passed, before it returned)."""
    (message,) = Message.objects.lease(queue, worker_id="w-test", hold=True)
    handler = registry.get(message.task)
    assert handler is not None
    context = MessageContext(
        message_id=message.id,
        task=message.task,
        queue=message.queue,
        attempt=message.attempts,
        max_attempts=message.max_attempts,
        worker_id="w-test",
        lease_token=message.lease_token,  # type: ignore[arg-type]
        enqueued_at=message.enqueued_at,
        _abandoned=lambda: abandoned,
    )
    if handler.is_async:
        return message, async_to_sync(handler.func)(context, message.payload)
    return message, handler.func(context, message.payload)


def _fail_the_held_attempt(error: Exception, worker_id: str = "w-test") -> None:
    """Record ``error`` as the failure of the first attempt of the one message, leased with
    ``hold`` by ``run``, for an immediate retry."""
    (leased,) = Message.objects.all()
    entry = transitions.error_entry(error, attempt=1, worker_id=worker_id)
    transitions.fail([transitions.FailedAttempt(lease=leased, error=entry, retry_in=0)])


def test_success_sends_started_and_finished(signals) -> None:
    result = t.add.enqueue(2, 3)
    _, value = run()
    assert value == 5
    assert [(name, sender) for name, sender, _ in signals] == [
        ("started", PgQueueBackend),
        ("finished", PgQueueBackend),
    ]
    started, finished = signals[0][2], signals[1][2]
    assert started.id == finished.id == result.id
    assert started.status == TaskResultStatus.RUNNING and started.worker_ids == ["w-test"]
    assert finished.status == TaskResultStatus.SUCCESSFUL and finished.return_value == 5


def test_a_run_the_worker_gave_up_sends_no_finished_signal(signals) -> None:
    """A sync task that returns (or raises on its last attempt) after its timeout: the worker
    failed the attempt already and its dead-letter hook reports the outcome, not the task."""
    t.add.enqueue(2, 3)
    _, value = run(abandoned=True)
    assert value == 5
    t.always_fails.enqueue("bad")
    Message.objects.filter(lease_token__isnull=True).update(max_attempts=1)
    with pytest.raises(ValueError, match="bad"):
        run(abandoned=True)
    assert [name for name, _, _ in signals] == ["started", "started"]


def test_context_attempt_counts_from_one(signals) -> None:
    t.flaky.enqueue(succeed_on=2)
    with pytest.raises(RuntimeError, match="attempt 1 fails"):
        run()
    # Attempt 1 failed and was not the last: no task_finished.
    assert [name for name, _, _ in signals] == ["started"]
    _fail_the_held_attempt(RuntimeError("x"))
    _, value = run()
    assert value["attempt"] == 2 and value["attempts"] == 2
    assert value["errors"] == ["builtins.RuntimeError"]
    assert value["status"] == "RUNNING"


def test_failure_on_last_attempt_sends_finished_failed(signals) -> None:
    t.always_fails.enqueue("bad")
    Message.objects.update(max_attempts=1)
    with pytest.raises(ValueError, match="bad"):
        run()
    name, sender, finished = signals[-1]
    assert (name, sender) == ("finished", PgQueueBackend)
    assert finished.status == TaskResultStatus.FAILED
    assert finished.errors[-1].exception_class is ValueError
    assert "ValueError: bad" in finished.errors[-1].traceback


def test_async_task_runs_through_its_async_handler(signals) -> None:
    t.async_add.enqueue(4, 5)
    _, value = run("tasks-other")
    assert value == {"sum": 9}
    assert [name for name, _, _ in signals] == ["started", "finished"]
    assert signals[0][2].worker_ids == ["w-test"]


def test_async_retry_reads_its_history(signals) -> None:
    t.async_flaky.enqueue()
    with pytest.raises(KeyError):
        run()
    _fail_the_held_attempt(KeyError("x"), worker_id="w-1")
    message, value = run()
    assert value == 2
    finished = signals[-1][2]
    assert finished.status == TaskResultStatus.SUCCESSFUL
    # From the row, read through the database in a sync thread: the history and this lease.
    assert finished.worker_ids == ["w-1", "w-test"]
    assert finished.last_attempted_at == message.leased_at


def test_unserializable_return_value_fails_the_attempt() -> None:
    t.returns_unserializable.enqueue()
    with pytest.raises(TypeError, match="Unsupported type"):
        run()


def test_a_payload_not_from_django_tasks_is_refused() -> None:
    Message.objects.create(task=t.add.module_path, payload=[1, 2], queue="default")
    with pytest.raises(ValueError, match="not"):
        run()
