"""Enqueue a task once the surrounding transaction commits."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction

from .backend import PgQueueBackend
from .framework import Task

__all__ = ["enqueue_on_commit"]


def enqueue_on_commit[**P](task: Task[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> None:
    """``task.enqueue(*args, **kwargs)`` after the current transaction commits (at once
    without one); nothing at all if it rolls back.

    The task and its arguments are validated now, so bad input raises ``InvalidTask`` in the
    caller, not after the commit. With django-pgqueue's backend a plain ``enqueue()`` inside
    the transaction is usually better (the task commits or rolls back with your data); use
    this when the queue is in another database than the data, or the task must not be
    written in a long transaction. The result id is not known until the commit: use
    ``task_enqueued`` or enqueue in the transaction if you need it.
    """
    backend = task.get_backend()
    if isinstance(backend, PgQueueBackend):
        backend.prepare(task, args, kwargs)  # every check enqueue() makes, nothing written
    else:
        backend.validate_task(task)
    using = getattr(backend, "database", None)
    transaction.on_commit(partial(task.enqueue, *args, **kwargs), using=using)
