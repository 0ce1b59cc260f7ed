"""get_result: one lookup across live / archive / dead, mapped onto Django's TaskResult."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

import django_pgqueue
from django_pgqueue.core import transitions
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message
from django_pgqueue.tasks import LeaseExpired
from django_pgqueue.tasks.framework import (
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task_backends,
)
from tests.taskapp import tasks as t

pytestmark = pytest.mark.django_db


def lease(worker: str = "w-1") -> Message:
    (message,) = Message.objects.lease("default", worker_id=worker, hold=True)
    return message


def fail(message: Message, exc: Exception) -> transitions.Outcome:
    entry = transitions.error_entry(exc, attempt=message.attempts, worker_id=message.leased_by)
    return transitions.fail([transitions.FailedAttempt(lease=message, error=entry, retry_in=0)])


def test_ready_then_running_then_successful() -> None:
    result = t.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY

    message = lease("w-1")
    running = t.add.get_result(result.id)
    assert running.status == TaskResultStatus.RUNNING
    assert running.worker_ids == ["w-1"] and running.attempts == 1
    assert running.started_at == message.leased_at == running.last_attempted_at

    transitions.complete([message], [5])
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.finished_at is not None and result.started_at == message.leased_at
    assert result.worker_ids == ["w-1"]
    assert ArchivedMessage.objects.filter(message_id=int(result.id)).exists()


def test_an_expired_lease_reads_as_ready() -> None:
    result = t.add.enqueue(1, 1)
    lease("w-1")
    Message.objects.filter(pk=int(result.id)).update(
        available_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    )
    found = t.add.get_result(result.id)
    assert found.status == TaskResultStatus.READY
    assert found.worker_ids == ["w-1"]  # the lost attempt counts


def test_failed_attempts_become_errors_then_failed() -> None:
    result = t.always_fails.enqueue("nope")  # max_attempts=2
    first = lease("w-1")
    assert fail(first, ValueError("one")).retried == [first.id]

    retrying = t.always_fails.get_result(result.id)
    assert retrying.status == TaskResultStatus.READY
    assert [e.exception_class_path for e in retrying.errors] == ["builtins.ValueError"]
    assert "ValueError: one" in retrying.errors[0].traceback
    assert retrying.errors[0].exception_class is ValueError
    assert retrying.worker_ids == ["w-1"]

    second = lease("w-2")
    assert fail(second, KeyError("two")).buried == [second.id]
    dead = t.always_fails.get_result(result.id)
    assert dead.status == TaskResultStatus.FAILED
    assert DeadMessage.objects.filter(message_id=int(result.id)).exists()
    assert [e.exception_class_path for e in dead.errors] == [
        "builtins.ValueError",
        "builtins.KeyError",
    ]
    assert dead.worker_ids == ["w-1", "w-2"] and dead.attempts == 2
    assert dead.started_at == first.leased_at  # first attempt, from the error history
    assert dead.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = dead.return_value


def test_lease_expired_on_last_attempt_is_a_failed_result() -> None:
    result = t.add.enqueue(1, 2)
    Message.objects.filter(pk=int(result.id)).update(max_attempts=1)
    lease("w-gone")
    Message.objects.filter(pk=int(result.id)).update(
        available_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    )
    # The next claim buries it (reason lease_expired).
    assert Message.objects.lease("default", worker_id="w-2", hold=True) == []
    dead = t.add.get_result(result.id)
    assert dead.status == TaskResultStatus.FAILED
    assert dead.errors[0].exception_class is LeaseExpired
    assert "lease expired" in dead.errors[0].traceback
    assert dead.worker_ids == ["w-gone"]


@pytest.mark.parametrize("bad_id", ["", "abc", "0", "-4", "1.5", str(2**63), "9" * 40])
def test_malformed_ids_do_not_exist(bad_id: str) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(bad_id)


def test_unknown_id_does_not_exist() -> None:
    result = t.add.enqueue(1, 2)
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(int(result.id) + 1000))


def test_a_plain_message_is_not_a_task_result() -> None:
    message = django_pgqueue.enqueue("send-welcome", {"user": 1})
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(message.id))


def test_task_get_result_checks_the_task() -> None:
    result = t.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        t.stamp.get_result(result.id)


def test_result_survives_its_queue_leaving_queues(settings) -> None:
    result = t.async_add.enqueue(1, 2)
    settings.TASKS = {
        "default": {"BACKEND": "django_pgqueue.tasks.PgQueueBackend", "QUEUES": ["default"]}
    }
    found = task_backends["default"].get_result(result.id)
    assert found.task.queue_name == "tasks-other"


def test_one_statement_finds_rows_in_any_table(django_assert_num_queries) -> None:
    result = t.add.enqueue(1, 2)
    with django_assert_num_queries(1):
        t.add.get_result(result.id)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgqueue_message")
    with django_assert_num_queries(1), pytest.raises(TaskResultDoesNotExist):
        t.add.get_result(result.id)


@pytest.mark.parametrize(
    ("recorded", "path"),
    [
        ("builtins.ValueError", "builtins.ValueError"),
        ("ValueError", "builtins.ValueError"),
        ("myapp.errors.Oops", "builtins.Exception"),
        ("Timeout", "django_pgqueue.exceptions.TaskTimeout"),
        ("LeaseExpired", "django_pgqueue.exceptions.LeaseExpired"),
        ("UnknownTask", "django_pgqueue.exceptions.TaskRejected"),
        ("Mystery", "builtins.Exception"),
    ],
)
def test_error_types_map_to_class_paths(recorded: str, path: str) -> None:
    from django_pgqueue.tasks.results import task_error

    error = task_error({"type": recorded, "message": "why", "traceback": ""})
    assert error.exception_class_path == path
    assert error.traceback == f"{recorded}: why\n"


def test_a_dead_task_retried_by_an_operator_is_ready_again_with_its_history() -> None:
    from django_pgqueue.core.operations import retry_dead

    result = t.always_fails.enqueue("x")
    Message.objects.update(max_attempts=1)
    message = lease("w-1")
    fail(message, ValueError("first life"))
    assert t.always_fails.get_result(result.id).status == TaskResultStatus.FAILED

    assert retry_dead([int(result.id)]).done == [int(result.id)]
    again = t.always_fails.get_result(result.id)
    assert again.status == TaskResultStatus.READY
    assert again.attempts == 0
    assert [e.exception_class for e in again.errors] == [ValueError]
