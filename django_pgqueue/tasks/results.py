"""A message row, wherever it is (live, archive, dead), as a Django ``TaskResult``.

The message id is kept when a row moves between the three tables, so ``TaskResult.id`` is
``str(message id)`` for the task's whole life and one statement finds it in any of them.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django.apps import apps
from django.db import connections

from ..exceptions import LeaseExpired, TaskRejected, TaskTimeout
from . import sql
from .framework import (
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)

__all__ = [
    "LeaseExpired",
    "TaskRejected",
    "TaskRow",
    "TaskTimeout",
    "fetch_row",
    "find_task",
    "parse_result_id",
    "remember_task",
    "to_result",
]

# Largest bigint: a larger id cannot exist and would make PostgreSQL raise instead of miss.
_MAX_ID = 2**63 - 1


def _path(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# Error types the worker records without a dotted path, mapped to importable classes so that
# ``TaskError.exception_class`` works for them too.
_ERROR_CLASSES = {
    "LeaseExpired": _path(LeaseExpired),
    "Timeout": _path(TaskTimeout),
    "UnknownTask": _path(TaskRejected),
}


class TaskRow(NamedTuple):
    table: str  # live | archive | dead
    task: str
    payload: Any
    priority: int
    queue: str
    enqueued_at: datetime
    available_at: datetime | None
    attempts: int
    errors: list[dict[str, Any]]
    worker: str | None  # the current / last attempt's worker
    attempt_started_at: datetime | None  # the current / last attempt's start
    running: bool
    result: Any
    finished_at: datetime | None
    dead_reason: str | None


def parse_result_id(result_id: object) -> int:
    """The message id behind a result id; malformed ids simply do not exist."""
    try:
        message_id = int(str(result_id), 10)
    except ValueError:
        raise TaskResultDoesNotExist(result_id) from None
    if not 0 < message_id <= _MAX_ID:
        raise TaskResultDoesNotExist(result_id)
    return message_id


def _json(value: Any) -> Any:
    # Django's psycopg 3 setup hands jsonb to Python as text.
    return json.loads(value) if isinstance(value, str) else value


def fetch_row(message_id: int, *, using: str) -> TaskRow | None:
    with connections[using].cursor() as cursor:
        cursor.execute(sql.LOOKUP, {"id": message_id})
        row = cursor.fetchone()
    if row is None:
        return None
    values = list(row)
    values[2] = _json(values[2])
    values[8] = _json(values[8]) or []
    values[12] = _json(values[12])
    return TaskRow(*values)


#: The tasks created in this process, by module path (``PgQueueTask`` registers itself).
_created: dict[str, Task] = {}


def remember_task(task: Task) -> None:
    """Make ``task`` findable by its module path without importing anything."""
    _created[task.module_path] = task


def find_task(module_path: str) -> Task | None:
    """The task object for a stored ``module_path``, or None if this code has no such task.

    The path comes from a row, which anyone able to write the table controls: tasks created
    in this process are known by path, and otherwise only a module already imported or one
    of an installed app is imported, so a stored path can never import an arbitrary module.
    What it names must be a ``Task`` whose own path is that one.
    """
    found = _created.get(module_path)
    if found is not None:
        return found
    module_name, _, name = module_path.rpartition(".")
    if not name.isidentifier() or not _may_import(module_name):
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    candidate = getattr(module, name, None)
    if isinstance(candidate, Task) and candidate.module_path == module_path:
        return candidate
    return None


def _may_import(module_name: str) -> bool:
    """Whether ``module_name`` is imported already or belongs to an installed app."""
    if module_name in sys.modules:
        return True
    if not all(part.isidentifier() for part in module_name.split(".")):
        return False
    return any(
        module_name == config.name or module_name.startswith(f"{config.name}.")
        for config in apps.get_app_configs()
    )


def unchecked_copy(task: Task, **changes: Any) -> Task:
    """A copy of ``task`` with ``changes``, skipping validation.

    ``Task.using()`` validates again: a stored result must stay readable after its queue was
    removed from ``QUEUES`` or its ``run_after`` has passed.
    """
    copy = object.__new__(type(task))
    for f in dataclasses.fields(task):
        object.__setattr__(copy, f.name, changes.get(f.name, getattr(task, f.name)))
    return copy


def _timestamp(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def task_error(entry: Mapping[str, Any]) -> TaskError:
    type_name = str(entry.get("type") or "Exception")
    path = exception_path(_ERROR_CLASSES.get(type_name, type_name))
    traceback = entry.get("traceback") or ""
    if not traceback:
        message = entry.get("message") or ""
        traceback = f"{type_name}: {message}\n" if message else f"{type_name}\n"
    return TaskError(exception_class_path=path, traceback=traceback)


def exception_path(name: str) -> str:
    """The path of the exception class a stored type ``name`` gives, for
    ``TaskError.exception_class`` (which imports it): a built-in, or a class of a module
    already imported, read without running any of its code; anything else is
    ``builtins.Exception``. The name comes from a row, which anyone able to write the table
    controls, so it never decides what is imported."""
    module_name, _, class_name = name.rpartition(".")
    module_name = module_name or "builtins"
    # The module's own namespace, not getattr: a module-level __getattr__ may import.
    namespace = getattr(sys.modules.get(module_name), "__dict__", {})
    found = namespace.get(class_name)
    if isinstance(found, type) and issubclass(found, BaseException):
        return f"{module_name}.{class_name}"
    return "builtins.Exception"


def is_cut_mark(entry: Mapping[str, Any]) -> bool:
    """The entry of a cut error history counting the attempts not kept (``_sql.history_cut``)."""
    return set(entry) == {"omitted"}


def worker_ids(row: TaskRow) -> list[str]:
    """One entry per attempt (so ``attempts`` = the row's attempt count).

    A failed attempt's worker comes from its error entry, the current or last attempt's from
    the row; an attempt whose worker vanished without a trace (its lease expired before a
    later attempt) is ``"unknown"``.
    """
    by_attempt: dict[int, str] = {}
    for entry in row.errors:
        attempt = entry.get("attempt")
        if isinstance(attempt, int) and entry.get("worker"):
            by_attempt[attempt] = str(entry["worker"])
    if row.attempts and row.worker:
        by_attempt.setdefault(row.attempts, row.worker)
    return [by_attempt.get(n, "unknown") for n in range(1, row.attempts + 1)]


def _status(row: TaskRow) -> TaskResultStatus:
    if row.table == "archive":
        return TaskResultStatus.SUCCESSFUL
    if row.table == "dead":
        return TaskResultStatus.FAILED
    return TaskResultStatus.RUNNING if row.running else TaskResultStatus.READY


def _attempt_times(row: TaskRow) -> tuple[datetime | None, datetime | None]:
    """(first attempt's start, latest attempt's start)."""
    starts = [_timestamp(e.get("started_at")) for e in row.errors]
    known = [s for s in starts if s is not None]
    current = row.attempt_started_at if row.attempts else None
    first = known[0] if known else current
    last = current or (known[-1] if known else None)
    return first, last


def split_payload(payload: Any) -> tuple[list[Any], dict[str, Any]] | None:
    if not isinstance(payload, Mapping):
        return None
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    if not isinstance(args, Sequence) or isinstance(args, str) or not isinstance(kwargs, Mapping):
        return None
    return list(args), dict(kwargs)


def to_result(row: TaskRow, task: Task, *, result_id: str, backend: str) -> TaskResult:
    split = split_payload(row.payload)
    if split is None:
        raise TaskResultDoesNotExist(result_id)
    args, kwargs = split
    status = _status(row)
    run_after = None
    if (
        row.table == "live"
        and row.attempts == 0
        and row.available_at is not None
        and row.available_at > row.enqueued_at
    ):
        run_after = row.available_at
    started_at, last_attempted_at = _attempt_times(row)
    result: TaskResult[Any, Any] = TaskResult(
        task=unchecked_copy(
            task,
            priority=row.priority,
            queue_name=row.queue,
            run_after=run_after,
            backend=backend,
        ),
        id=result_id,
        status=status,
        enqueued_at=row.enqueued_at,
        started_at=started_at,
        finished_at=row.finished_at,
        last_attempted_at=last_attempted_at,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=[task_error(e) for e in row.errors if isinstance(e, Mapping) and not is_cut_mark(e)],
        worker_ids=worker_ids(row),
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", row.result)
    return result
