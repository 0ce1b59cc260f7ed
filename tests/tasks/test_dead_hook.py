"""``task_finished`` for final failures the task function never saw: a lease that expired on
the last attempt (the worker died) is buried by whichever process claims next."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection

from django_pgqueue.core._registry import registry
from django_pgqueue.models import DeadMessage, Message
from django_pgqueue.tasks.framework import TaskResultStatus, task_finished
from tests.taskapp import tasks as t

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_task_whose_worker_died_on_its_last_attempt_finishes_failed() -> None:
    result = t.add.enqueue(1, 2)
    with connection.cursor() as cursor:  # the worker took it and died: its lease ran out
        cursor.execute(
            "UPDATE pgqueue_message SET attempts = max_attempts, lease_token = gen_random_uuid(),"
            " leased_by = 'dead-worker', available_at = now() - interval '1 second'"
        )
    seen: list[Any] = []

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append((sender, task_result))

    task_finished.connect(finished, weak=False)
    try:
        assert Message.objects.lease("default", worker_id="next-worker", batch_size=5) == []
    finally:
        task_finished.disconnect(finished)
    assert DeadMessage.objects.get(message_id=int(result.id)).reason == "lease_expired"
    [(sender, finished_result)] = seen
    assert sender is type(t.add.get_backend())
    assert finished_result.id == result.id
    assert finished_result.status == TaskResultStatus.FAILED


def test_plain_handlers_hear_of_their_dead_letters_and_a_broken_hook_is_contained(caplog) -> None:
    import django_pgqueue
    from tests.factories import MessageFactory

    calls: list[tuple[int, str]] = []

    @django_pgqueue.handler("tests.hooked")
    def hooked(payload: Any) -> None:
        return None

    def broken(message_id: int, reason: str) -> None:
        calls.append((message_id, reason))
        raise RuntimeError("hook bug")

    handler = registry.get("tests.hooked")
    assert handler is not None
    registry.unregister("tests.hooked")
    from dataclasses import replace

    registry.register(replace(handler, on_dead=broken))
    try:
        message = MessageFactory(
            task="tests.hooked",
            expired=True,
            attempts=3,
            max_attempts=3,
            available_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1),
        )
        assert Message.objects.lease("default", worker_id="w") == []
    finally:
        registry.unregister("tests.hooked")
    assert calls == [(message.id, "lease_expired")]
    assert "on_dead hook of tests.hooked failed" in caplog.text
