"""``PgQueueBackend``: Django's Tasks framework on django-pgqueue's tables and worker.

A task is one message row: ``task`` = the task's ``module_path``, ``payload`` =
``{"args": [...], "kwargs": {...}}``, and priority / queue / ``run_after`` map to the row's
priority / queue / ``available_at``. The row is written in the caller's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, cast

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from .. import tracing
from ..conf import get_settings
from ..core._enqueue import PreparedMessage, prepare_message, write_message
from ..core._validation import (
    MAX_ATTEMPTS_LIMIT,
    QUEUE_NAME_PATTERN,
    TASK_NAME_MAX_LENGTH,
    valid_max_attempts,
    validate_queue_name,
    validate_task_name,
)
from ..exceptions import InvalidMessage
from .framework import (
    BaseTaskBackend,
    DummyBackend,
    ImmediateBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
)
from .options import TASK_OPTIONS
from .results import fetch_row, find_task, parse_result_id, to_result, unchecked_copy
from .task import PgQueueTask

__all__ = [
    "InvalidTaskMessage",
    "PgQueueBackend",
    "PgQueueDummyBackend",
    "PgQueueImmediateBackend",
]


class InvalidTaskMessage(InvalidTask, InvalidMessage):
    """A task django-pgqueue cannot store as a message (a payload over the cap, text with
    U+0000, a ``run_after`` out of range...): Django's ``InvalidTask`` and django-pgqueue's
    ``InvalidMessage`` at once, so either ``except`` catches it."""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# Each option: (is valid, what a valid value is). ``None`` always means "not set here".
_OPTION_RULES = {
    "max_attempts": (valid_max_attempts, f"a whole number in [1, {MAX_ATTEMPTS_LIMIT}]"),
    "backoff": (lambda v: _number(v) and v >= 0, "a number of seconds >= 0"),
    "backoff_max": (lambda v: _number(v) and v >= 0, "a number of seconds >= 0"),
    "timeout": (lambda v: _number(v) and v > 0, "a number of seconds > 0"),
    "visibility_timeout": (lambda v: _number(v) and v > 0, "a number of seconds > 0"),
}
assert set(_OPTION_RULES) == set(TASK_OPTIONS)


def option_problems(options: Any) -> list[str]:
    if not isinstance(options, Mapping):
        return [f"OPTIONS must be a dict, not {type(options).__name__}."]
    problems = [
        f"Unknown OPTIONS key {key!r}; known keys: {', '.join(TASK_OPTIONS)}."
        for key in sorted(set(options) - set(_OPTION_RULES), key=str)
    ]
    for key, (is_valid, expected) in _OPTION_RULES.items():
        value = options.get(key)
        if value is not None and not is_valid(value):
            problems.append(f"OPTIONS[{key!r}] must be {expected}; got {value!r}.")
    return problems


class _WithoutRunAfter:
    """``task`` seen with ``run_after=None``, for Django's checks that cannot take a timedelta."""

    def __init__(self, task: Task) -> None:
        self._task = task

    def __getattr__(self, name: str) -> Any:
        return None if name == "run_after" else getattr(self._task, name)


class PgQueueBackend(BaseTaskBackend):
    """``TASKS = {"default": {"BACKEND": "django_pgqueue.tasks.PgQueueBackend", ...}}``.

    ``OPTIONS`` (all optional, lowercase): ``max_attempts``, ``backoff``, ``backoff_max``,
    ``timeout``, ``visibility_timeout``: defaults for tasks that do not set their own.
    """

    task_class = PgQueueTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        # Cheap on purpose: built per thread, possibly at import time before apps are ready.
        super().__init__(alias, params)
        self._option_problems = option_problems(self.options)

    # -- configuration ---------------------------------------------------------------------

    def task_defaults(self, *, strict: bool = True) -> dict[str, Any]:
        """The ``OPTIONS`` defaults for task options.

        ``strict``: raise ``ImproperlyConfigured`` if ``OPTIONS`` is broken (enqueue does);
        otherwise skip the bad values (registration at import time does, so that
        ``manage.py check`` can still run and report them as ``django_pgqueue.E020``).
        """
        if strict and self._option_problems:
            raise ImproperlyConfigured(f"TASKS[{self.alias!r}]: " + " ".join(self._option_problems))
        options = self.options if isinstance(self.options, Mapping) else {}
        defaults: dict[str, Any] = {}
        for key in TASK_OPTIONS:
            value = options.get(key)
            defaults[key] = value if value is not None and _OPTION_RULES[key][0](value) else None
        return defaults

    @property
    def database(self) -> str:
        return get_settings().DATABASE_ALIAS

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages: list[checks.CheckMessage] = list(super().check(**kwargs))
        messages += [
            checks.Error(
                f"TASKS[{self.alias!r}]: {problem}",
                hint="See docs/how-to/django-tasks.md for the options.",
                obj=self,
                id="django_pgqueue.E020",
            )
            for problem in self._option_problems
        ]
        if not apps.is_installed("django_pgqueue"):
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses PgQueueBackend but 'django_pgqueue' is not in "
                    "INSTALLED_APPS.",
                    hint="Add 'django_pgqueue' to INSTALLED_APPS and run migrate.",
                    obj=self,
                    id="django_pgqueue.E021",
                )
            )
        for queue in sorted(self.queues):
            try:
                validate_queue_name(queue)
            except InvalidMessage as exc:
                messages.append(
                    checks.Error(
                        f"TASKS[{self.alias!r}]['QUEUES']: {exc}",
                        hint=f"Queue names must match {QUEUE_NAME_PATTERN}.",
                        obj=self,
                        id="django_pgqueue.E022",
                    )
                )
        return messages

    # -- validation ------------------------------------------------------------------------

    def validate_task(self, task: Task[Any, Any]) -> None:
        run_after: Any = task.run_after
        if isinstance(run_after, timedelta):
            # Django documents timedelta but its own check calls run_after.utcoffset().
            super().validate_task(cast("Task[Any, Any]", _WithoutRunAfter(task)))
            if run_after < timedelta(0):
                raise InvalidTask("run_after must not be a negative timedelta.")
        else:
            super().validate_task(task)
        try:
            validate_queue_name(task.queue_name)
        except InvalidMessage as exc:
            raise InvalidTaskMessage(str(exc)) from None
        if len(task.module_path) > TASK_NAME_MAX_LENGTH:
            raise InvalidTask(
                f"Task path {task.module_path!r} is longer than {TASK_NAME_MAX_LENGTH} characters."
            )
        try:
            validate_task_name(task.module_path)
        except InvalidMessage as exc:
            raise InvalidTaskMessage(str(exc)) from None
        if isinstance(task, PgQueueTask):
            for key, (is_valid, expected) in _OPTION_RULES.items():
                value = getattr(task, key)
                if value is not None and not is_valid(value):
                    raise InvalidTask(f"{key} must be {expected}; got {value!r}.")

    def _payload(self, task: Task[Any, Any], args: Any, kwargs: Any) -> dict[str, Any]:
        """The message payload; ``InvalidTask`` unless it survives a JSON round trip intact."""
        try:
            payload: dict[str, Any] = {
                "args": normalize_json(list(args)),
                "kwargs": normalize_json(dict(kwargs)),
            }
            text = json.dumps(payload, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidTask(f"Task arguments must be JSON-serializable: {exc}") from exc
        if json.loads(text) != payload:
            raise InvalidTask(
                "Task arguments must round-trip through JSON unchanged (dict keys must be strings)."
            )
        if task.backend != self.alias:
            payload["backend"] = self.alias
        return payload

    def _max_attempts(self, task: Task[Any, Any]) -> int | None:
        own = getattr(task, "max_attempts", None)
        return own if own is not None else self.task_defaults()["max_attempts"]

    def prepare(
        self, task: Task[Any, Any], args: Any, kwargs: Any
    ) -> tuple[dict[str, Any], PreparedMessage]:
        """(payload, message) for ``task(*args, **kwargs)``, every check done and nothing
        written: ``InvalidTask`` (:class:`InvalidTaskMessage` for what the queue refuses)."""
        self.validate_task(task)
        payload = self._payload(task, args, kwargs)
        try:
            message = prepare_message(
                task.module_path,
                payload,
                queue=task.queue_name,
                priority=task.priority,
                run_after=task.run_after,
                dedup_key=None,
                max_attempts=self._max_attempts(task),
                tenant=None,
            )
        except InvalidMessage as exc:  # e.g. over PGQUEUE['MAX_PAYLOAD_BYTES']
            raise InvalidTaskMessage(str(exc)) from exc
        return payload, message

    # -- the contract ----------------------------------------------------------------------

    def enqueue(
        self, task: Task[Any, Any], args: Any, kwargs: dict[str, Any]
    ) -> TaskResult[Any, Any]:
        using = self.database
        # A PRODUCER span when tracing is configured; the headers carry its context.
        with tracing.sending(task.queue_name, task.module_path) as span:
            payload, prepared = self.prepare(task, args, kwargs)
            message = write_message(prepared, using)
            tracing.sent(span, message.id)
        if message.available_at is not None and message.available_at > message.enqueued_at:
            # Shows a timedelta as the absolute (database) time it resolved to.
            task = unchecked_copy(task, run_after=message.available_at)
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=str(message.id),
            status=TaskResultStatus.READY,
            enqueued_at=message.enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        sender = type(self)

        # Announce only what commits: a rolled-back enqueue left no row and sends nothing. A
        # function, not a partial: Django 5.2 logs a failing robust hook by its __qualname__.
        def announce() -> None:
            task_enqueued.send(sender=sender, task_result=result)

        transaction.on_commit(announce, using=using, robust=True)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        message_id = parse_result_id(result_id)
        row = fetch_row(message_id, using=self.database)
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        task = find_task(row.task)
        if task is None or not _runs_on_pgqueue(task, row.payload):
            # A plain message, a task this code no longer defines, or not one of ours.
            raise TaskResultDoesNotExist(result_id)
        return to_result(row, task, result_id=str(message_id), backend=self.alias)


def _runs_on_pgqueue(task: Task[Any, Any], payload: Any) -> bool:
    """Whether the backend the row was enqueued through (the payload's ``backend``, else the
    task's own) is a django-pgqueue backend: only those write these rows."""
    alias = payload.get("backend") if isinstance(payload, Mapping) else None
    try:
        backend = task_backends[alias if isinstance(alias, str) else task.backend]
    except InvalidTaskBackend:
        return False
    return isinstance(backend, PgQueueBackend)


class PgQueueImmediateBackend(ImmediateBackend):
    """Django's ImmediateBackend (runs tasks at once, in process) accepting ``PgQueueTask``
    options, for fast unit tests of code that uses ``@task(max_attempts=...)``."""

    task_class = PgQueueTask


class PgQueueDummyBackend(DummyBackend):
    """Django's DummyBackend (stores, never runs) accepting ``PgQueueTask`` options."""

    task_class = PgQueueTask
