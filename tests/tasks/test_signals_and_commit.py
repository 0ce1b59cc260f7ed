"""task_enqueued fires only for committed enqueues; enqueue_on_commit waits for the commit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

from django_pgqueue.models import Message
from django_pgqueue.tasks import PgQueueBackend, enqueue_on_commit
from django_pgqueue.tasks.framework import InvalidTask, task_enqueued
from tests.taskapp import tasks as t


@pytest.fixture
def enqueued() -> Iterator[list[tuple[Any, Any]]]:
    seen: list[tuple[Any, Any]] = []

    def record(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append((sender, task_result))

    task_enqueued.connect(record, weak=False)
    yield seen
    task_enqueued.disconnect(record)


@pytest.mark.django_db(transaction=True)
def test_task_enqueued_waits_for_the_commit(enqueued) -> None:
    with transaction.atomic():
        result = t.add.enqueue(1, 2)
        assert enqueued == []  # the row exists only inside this transaction
    assert [(s, r.id) for s, r in enqueued] == [(PgQueueBackend, result.id)]


@pytest.mark.django_db(transaction=True)
def test_no_task_enqueued_and_no_row_on_rollback(enqueued) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        result = t.add.enqueue(1, 2)
        raise Boom
    assert enqueued == []
    assert not Message.objects.filter(pk=int(result.id)).exists()


@pytest.mark.django_db(transaction=True)
def test_task_enqueued_at_once_in_autocommit(enqueued) -> None:
    result = t.add.enqueue(1, 2)
    assert [r.id for _, r in enqueued] == [result.id]


@pytest.mark.django_db(transaction=True)
def test_savepoint_rollback_drops_only_its_signal(enqueued) -> None:
    with transaction.atomic():
        kept = t.add.enqueue(1, 2)
        try:
            with transaction.atomic():
                t.add.enqueue(3, 4)
                raise RuntimeError
        except RuntimeError:
            pass
    assert [r.id for _, r in enqueued] == [kept.id]
    assert Message.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_failing_receiver_does_not_break_the_enqueue(enqueued) -> None:
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    task_enqueued.connect(broken, weak=False)
    try:
        with transaction.atomic():
            result = t.add.enqueue(1, 2)
    finally:
        task_enqueued.disconnect(broken)
    assert Message.objects.filter(pk=int(result.id)).exists()
    assert len(enqueued) == 1


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_writes_after_commit_only() -> None:
    with transaction.atomic():
        enqueue_on_commit(t.add, 5, b=6)
        assert Message.objects.count() == 0
    (row,) = Message.objects.all()
    assert row.payload == {"args": [5], "kwargs": {"b": 6}}

    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_on_commit(t.add, 7, 8)
        raise RuntimeError
    assert Message.objects.count() == 1


@pytest.mark.django_db
def test_enqueue_on_commit_validates_at_once() -> None:
    import datetime as dt

    with pytest.raises(InvalidTask):
        enqueue_on_commit(t.add, dt.date(2026, 1, 1), 1)
