"""The Tasks framework's names, under Django's spelling, from ``django.tasks`` (Django 6.0+) or
the ``django-tasks`` backport on Django 5.2 (which spells ``InvalidTask`` ``InvalidTaskError``,
exports ``Task`` from ``base`` only and keeps ``normalize_json`` in its own ``utils``).
Importing this without either raises ``ImportError`` saying what to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..compat import TASKS_FRAMEWORK, tasks_framework_missing

if TYPE_CHECKING or TASKS_FRAMEWORK == "django.tasks":
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.backends.dummy import DummyBackend
    from django.tasks.backends.immediate import ImmediateBackend
    from django.tasks.base import DEFAULT_TASK_PRIORITY, TaskError
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
elif TASKS_FRAMEWORK == "django_tasks":
    from django_tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.backends.dummy import DummyBackend
    from django_tasks.backends.immediate import ImmediateBackend
    from django_tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json
else:
    raise tasks_framework_missing()

__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "BaseTaskBackend",
    "DummyBackend",
    "ImmediateBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
