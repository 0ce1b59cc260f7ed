"""How the worker runs a task: a registry handler per task, keyed by its ``module_path``.

The handler sends ``task_started``, calls the task function (with a ``TaskContext`` when it
takes one), returns the JSON-normalized value for the worker to archive, and sends
``task_finished`` for the final outcome only: success, or a failure on the last attempt.
A failure with attempts left is retried by the worker and sends nothing.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.dispatch import Signal
from django.utils import timezone

from ..conf import get_settings
from ..core._registry import Handler, registry
from ..exceptions import Snooze
from . import results
from .framework import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from .options import task_options

if TYPE_CHECKING:
    from ..worker.context import MessageContext

__all__ = ["register_task"]

logger = logging.getLogger("django_pgqueue.tasks")

# Marks our wrappers in the shared registry: (task function it runs).
_MARK = "_pgqueue_task_func"


def register_task(task: Task[Any, Any]) -> None:
    """Register ``task`` with the worker (idempotent; ``using()`` copies are no-ops)."""
    name = task.module_path
    existing = registry.get(name)
    if existing is not None:
        if getattr(existing.func, _MARK, None) is task.func:
            return
        if hasattr(existing.func, _MARK):
            # The module was imported again (autoreload, importlib.reload): the new wins.
            registry.unregister(name)
    options = task_options(task)
    func = _async_runner(task) if inspect.iscoroutinefunction(task.func) else _sync_runner(task)
    setattr(func, _MARK, task.func)
    registry.register(
        Handler(
            name=name,
            func=func,
            is_async=inspect.iscoroutinefunction(task.func),
            takes_context=True,
            queue=None,
            max_attempts=options["max_attempts"],
            timeout=options["timeout"],
            visibility_timeout=options["visibility_timeout"],
            backoff_base=options["backoff"],
            backoff_max=options["backoff_max"],
            on_dead=_finished_outside_the_function(task),
        )
    )
    results.remember_task(task)


def _finished_outside_the_function(task: Task) -> Callable[[int, str], None]:
    """``task_finished`` for a final failure the task function did not raise itself.

    A raise on the last attempt (reason ``error``) already sent it from the runner; a last
    attempt that timed out or whose worker died (``timeout``, ``lease_expired``) ends here.
    """

    def on_dead(message_id: int, reason: str) -> None:
        if reason == "error":
            return
        backend = task_backends[task.backend]
        _send(task_finished, type(backend), backend.get_result(str(message_id)))

    return on_dead


def _decode(task: Task, payload: Any) -> tuple[list[Any], dict[str, Any], str]:
    split = results.split_payload(payload)
    if split is None:
        raise ValueError(
            f"Task {task.module_path} got a payload that is not "
            '{"args": [...], "kwargs": {...}}; was it enqueued through django.tasks?'
        )
    backend = payload.get("backend", task.backend)
    return split[0], split[1], backend


def _running_result(
    task: Task, context: MessageContext, args: list[Any], kwargs: dict[str, Any], backend: str
) -> TaskResult:
    """The task's result as the worker runs it: the stored history plus this attempt.

    A first attempt has no history, so it is built from the context alone (no query: this
    is the hot path); a retry reads the row for its errors and earlier workers.
    """
    if context.attempt > 1:
        row = results.fetch_row(context.message_id, using=get_settings().DATABASE_ALIAS)
        if row is not None and row.table == "live":
            return results.to_result(
                row._replace(running=True),
                task,
                result_id=str(context.message_id),
                backend=backend,
            )
    # First attempt, or the row moved meanwhile (an operator discarded it).
    now = timezone.now()
    return TaskResult(
        task=results.unchecked_copy(task, queue_name=context.queue, backend=backend),
        id=str(context.message_id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=context.enqueued_at,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=[],
        worker_ids=["unknown"] * (context.attempt - 1) + [context.worker_id],
    )


def _returned(value: Any) -> Any:
    """The value as the archive stores it; raising here fails the attempt, as Django does."""
    value = normalize_json(value)
    json.dumps(value, allow_nan=False)
    return value


def _succeeded(running: TaskResult, value: Any) -> TaskResult:
    done = dataclasses.replace(
        running, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now()
    )
    object.__setattr__(done, "_return_value", value)
    return done


def _failed(running: TaskResult, exc: BaseException) -> TaskResult:
    error = TaskError(
        exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
        traceback="".join(traceback.format_exception(exc)),
    )
    return dataclasses.replace(
        running,
        status=TaskResultStatus.FAILED,
        finished_at=timezone.now(),
        errors=[*running.errors, error],
    )


def _send(signal: Signal, sender: type, result: TaskResult) -> None:
    # A broken receiver must not turn a finished task into a failed one.
    for receiver, response in signal.send_robust(sender=sender, task_result=result):
        if isinstance(response, BaseException):
            logger.error(
                "Receiver %r of %s raised for task %s",
                receiver,
                "task_started" if signal is task_started else "task_finished",
                result.id,
                exc_info=response,
            )


async def _asend(signal: Signal, sender: type, result: TaskResult) -> None:
    for receiver, response in await signal.asend_robust(sender=sender, task_result=result):
        if isinstance(response, BaseException):
            logger.error("Receiver %r raised for task %s", receiver, result.id, exc_info=response)


def _sync_runner(task: Task) -> Callable[[MessageContext, Any], Any]:
    def run(context: MessageContext, payload: Any) -> Any:
        args, kwargs, alias = _decode(task, payload)
        sender = type(task_backends[alias])
        running = _running_result(task, context, args, kwargs, alias)
        _send(task_started, sender, running)
        try:
            if task.takes_context:
                value = task.func(TaskContext(task_result=running), *args, **kwargs)
            else:
                value = task.func(*args, **kwargs)
            value = _returned(value)
        except Snooze:
            raise  # not a failure: the worker puts the message back to wait
        except Exception as exc:
            if context.is_last_attempt and not context.abandoned:
                # Inside the except block: Django's logging receiver records exc_info.
                _send(task_finished, sender, _failed(running, exc))
            raise
        # A run the worker gave up on (timed out) was finished by its dead-letter hook, or
        # will be retried: its late outcome is dropped, and so is the signal.
        if not context.abandoned:
            _send(task_finished, sender, _succeeded(running, value))
        return value

    return run


def _async_runner(task: Task) -> Callable[[MessageContext, Any], Any]:
    async def run(context: MessageContext, payload: Any) -> Any:
        args, kwargs, alias = _decode(task, payload)
        sender = type(task_backends[alias])
        if context.attempt > 1:
            # The event loop's thread may not touch the database: read the history in
            # Django's thread for sync code (one connection, reused).
            running = await sync_to_async(_running_result, thread_sensitive=True)(
                task, context, args, kwargs, alias
            )
        else:
            running = _running_result(task, context, args, kwargs, alias)
        await _asend(task_started, sender, running)
        try:
            if task.takes_context:
                value = await task.func(TaskContext(task_result=running), *args, **kwargs)
            else:
                value = await task.func(*args, **kwargs)
            value = _returned(value)
        except Snooze:
            raise
        except Exception as exc:
            if context.is_last_attempt:
                await _asend(task_finished, sender, _failed(running, exc))
            raise
        await _asend(task_finished, sender, _succeeded(running, value))
        return value

    return run
