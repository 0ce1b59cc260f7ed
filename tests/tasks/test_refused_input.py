"""What the Tasks backend refuses before anything is written: a task path with control
characters (it would forge log lines) and options past the attempt limit."""

from __future__ import annotations

import pytest

from django_pgqueue.core._validation import MAX_ATTEMPTS_LIMIT
from django_pgqueue.exceptions import InvalidMessage
from django_pgqueue.models import Message
from django_pgqueue.tasks import PgQueueTask
from django_pgqueue.tasks.backend import PgQueueBackend
from django_pgqueue.tasks.framework import InvalidTask, task_backends

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_tasks_backend_refuses_a_task_path_with_control_characters() -> None:
    def odd(x: int) -> int:
        return x

    odd.__qualname__ = "odd\nERROR forged"
    fields = {"priority": 0, "queue_name": "default", "run_after": None}
    with pytest.raises(InvalidTask, match="control character U\\+000A"):
        PgQueueTask(func=odd, backend="default", **fields)
    # Built for another backend (whose check lets it through), then enqueued on ours.
    loose = PgQueueTask(func=odd, backend="dummy", **fields)
    with pytest.raises(InvalidMessage, match="control character U\\+000A"):
        task_backends["default"].enqueue(loose, (1,), {})
    assert Message.objects.count() == 0


def test_max_attempts_above_the_limit_is_refused_in_the_tasks_backend_options() -> None:
    backend = PgQueueBackend(
        "x", {"QUEUES": ["a"], "OPTIONS": {"max_attempts": MAX_ATTEMPTS_LIMIT + 1}}
    )
    [problem] = backend.check()
    assert f"[1, {MAX_ATTEMPTS_LIMIT}]" in problem.msg
