"""A redelivered message runs alone in its worker, its start recorded first (the attempt
rule: core/_sql.py, worker/executor.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection

import django_pgqueue
from django_pgqueue.core import _execution
from django_pgqueue.models import ArchivedMessage, Message
from tests.testapp import handlers

from .conftest import WorkerThread

pytestmark = pytest.mark.django_db(transaction=True)
StartWorker = Callable[..., WorkerThread]


def redelivered(task: str, payload: dict[str, float]) -> int:
    """A message whose previous lease (a worker's) expired: the next claim redelivers it."""
    message_id = django_pgqueue.enqueue(task, payload).id
    connection.close()
    _execution.dedicate_to_claims(connection, refund_on_expiry=True)
    [leased] = Message.objects.lease("default", worker_id="dead-worker")
    assert leased.id == message_id
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_message SET available_at = now() - interval '1 second' WHERE id = %s",
            [message_id],
        )
    connection.close()
    return message_id


@pytest.mark.parametrize("task", ["tests.timed", "tests.async-timed"])
def test_a_redelivered_message_runs_with_no_other_handler_beside_it(
    start_worker: StartWorker, task: str
) -> None:
    handlers.TIMELINE.clear()
    alone = redelivered(task, {"seconds": 0.3})
    others = [django_pgqueue.enqueue(task, {"seconds": 0.2}).id for _ in range(6)]
    assert start_worker(burst=True, concurrency=4).join() == 0
    runs = {message_id: (start, end) for message_id, start, end in handlers.TIMELINE}
    assert set(runs) == {alone, *others}
    start, end = runs[alone]
    overlapping = [i for i in others if runs[i][0] < end and runs[i][1] > start]
    assert overlapping == []
    # The others still ran side by side.
    assert any(
        runs[a][0] < runs[b][1] and runs[b][0] < runs[a][1]
        for a in others
        for b in others
        if a != b
    )
    row = ArchivedMessage.objects.get(message_id=alone)
    assert row.attempts == 1  # the expired lease gave its attempt back
