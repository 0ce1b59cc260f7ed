"""django.tasks tasks as steps of chains and batches, run by a real worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from django_pgqueue import enqueue_batch, enqueue_chain, step
from django_pgqueue.models import Batch, WaitingMessage
from django_pgqueue.tasks.framework import TaskResultStatus
from tests.taskapp import tasks as t

from .test_worker import run_worker

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_chain_of_tasks_passes_each_result_on(signal_log: Path) -> None:
    written = enqueue_chain([step(t.add, 2, 3), step(t.add_to_previous, 10)])
    first, second = written.ids
    # A step waiting for the one before is a queued task to the Tasks API.
    assert t.add_to_previous.get_result(str(second)).status == TaskResultStatus.READY
    for _ in range(3):  # a burst worker stops once nothing is ready
        run_worker(signal_log)
        if not WaitingMessage.objects.exists():
            break
    run_worker(signal_log)
    assert t.add.get_result(str(first)).return_value == 5
    result = t.add_to_previous.get_result(str(second))
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 15


def test_a_batch_of_tasks_with_a_task_callback(signal_log: Path) -> None:
    batch = enqueue_batch([step(t.add, n, n) for n in range(5)], on_success=step(t.stamp, "all"))
    for _ in range(3):
        run_worker(signal_log)
    row = Batch.objects.get(id=batch.id)
    assert (row.total, row.succeeded, row.failed) == (5, 5, 0)
    assert batch.on_success is not None
    callback = t.stamp.get_result(str(batch.on_success.id))
    assert callback.status == TaskResultStatus.SUCCESSFUL


def test_a_task_of_another_backend_is_refused_as_a_step() -> None:
    from django_pgqueue.exceptions import InvalidMessage

    with pytest.raises(InvalidMessage, match="not django-pgqueue's"):
        enqueue_chain([step(t.on_dummy, 1)])
