"""``context.headers``: what enqueue gave, read-only, empty when none."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import django_pgqueue
from django_pgqueue.models import ArchivedMessage
from django_pgqueue.worker.context import MessageContext

from .conftest import WorkerThread

pytestmark = pytest.mark.django_db(transaction=True)
StartWorker = Callable[..., WorkerThread]


@pytest.mark.parametrize("task", ["tests.headers", "tests.async-headers"])
def test_the_handler_reads_the_headers(start_worker: StartWorker, task: str) -> None:
    given = django_pgqueue.enqueue(task, {}, headers={"request-id": "abc", "lang": "fr"})
    plain = django_pgqueue.enqueue(task, {})
    assert start_worker(burst=True).join() == 0
    results = dict(ArchivedMessage.objects.values_list("message_id", "result"))
    assert results == {given.id: {"request-id": "abc", "lang": "fr"}, plain.id: {}}


def test_context_headers_are_read_only() -> None:
    context = MessageContext(1, "t", "q", 1, 1, "w", None)  # type: ignore[arg-type]
    assert dict(context.headers) == {}
    with pytest.raises(TypeError):
        context.headers["x"] = "y"  # type: ignore[index]
