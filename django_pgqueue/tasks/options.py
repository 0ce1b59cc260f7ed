"""The options a ``PgQueueTask`` carries beyond Django's, and how a task's values fall back to
its backend's ``OPTIONS``."""

from __future__ import annotations

from typing import Any

from .framework import Task

__all__ = ["TASK_OPTIONS", "task_options"]

#: The options a ``PgQueueTask`` carries beyond Django's; the same lowercase names are the
#: backend-wide defaults in ``TASKS[alias]["OPTIONS"]``.
TASK_OPTIONS = ("max_attempts", "backoff", "backoff_max", "timeout", "visibility_timeout")


def task_options(task: Task[Any, Any]) -> dict[str, Any]:
    """The task's options, falling back to its backend's ``OPTIONS`` (``None`` = PGQUEUE).

    Only django-pgqueue backends have ``task_defaults``; Django's immediate and dummy backends
    (and their PgQueue variants) contribute no defaults.
    """
    task_defaults = getattr(task.get_backend(), "task_defaults", None)
    defaults = task_defaults(strict=False) if task_defaults is not None else {}
    values = {}
    for key in TASK_OPTIONS:
        value = getattr(task, key, None)
        values[key] = defaults.get(key) if value is None else value
    return values
