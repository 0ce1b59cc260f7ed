"""Tasks for the django.tasks backend tests. Installed app module: the worker autodiscovers it.

Signal receivers here append one JSON line per signal to the file named by
``PGQ_TASKS_SIGNAL_LOG`` (when set), so tests can see what a worker subprocess sent.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import time
from typing import Any

from django.dispatch import receiver

from django_pgqueue.tasks import task
from django_pgqueue.tasks.framework import TaskContext, task_enqueued, task_finished, task_started
from django_pgqueue.tasks.framework import task as django_task


@task
def add(a: int, b: int) -> int:
    return a + b


@task(takes_context=True, max_attempts=3, backoff=0)
def flaky(context: TaskContext[Any, Any], succeed_on: int) -> dict[str, Any]:
    """Fails until attempt ``succeed_on``; returns what its context said."""
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails on purpose")
    return {
        "attempt": context.attempt,
        "attempts": context.task_result.attempts,
        "errors": [e.exception_class_path for e in context.task_result.errors],
        "status": str(context.task_result.status),
    }


@task(max_attempts=2, backoff=0)
def always_fails(reason: str) -> None:
    raise ValueError(reason)


@task(queue_name="tasks-other")
async def async_add(a: int, b: int) -> dict[str, int]:
    await asyncio.sleep(0)
    return {"sum": a + b}


@task(takes_context=True, max_attempts=2, backoff=0)
async def async_flaky(context: TaskContext[Any, Any]) -> int:
    if context.attempt == 1:
        raise KeyError("first attempt")
    return context.attempt


@task
def stamp(label: str) -> dict[str, Any]:
    """Records when it ran (ns, host clock of the one worker process): execution order."""
    return {"label": label, "ns": time.monotonic_ns()}


@task
def returns_unserializable() -> object:
    return object()


def _log(signal: str, sender: Any, task_result: Any) -> None:
    path = os.environ.get("PGQ_TASKS_SIGNAL_LOG")
    if not path:
        return
    line = {
        "signal": signal,
        "sender": f"{sender.__module__}.{sender.__qualname__}"
        if isinstance(sender, type)
        else repr(sender),
        "id": task_result.id,
        "task": task_result.task.module_path,
        "status": str(task_result.status),
        "attempts": task_result.attempts,
        "errors": len(task_result.errors),
    }
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


@receiver(task_started)
def _on_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
    _log("started", sender, task_result)


@receiver(task_finished)
def _on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    _log("finished", sender, task_result)


@receiver(task_enqueued)
def _on_enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
    _log("enqueued", sender, task_result)


@task(backend="dummy", max_attempts=4)
def on_dummy(x: int) -> int:
    """Built for another backend (Django's DummyBackend with our task class)."""
    return 2 * x


@task(max_attempts=1, timeout=1)
def too_slow() -> None:
    time.sleep(3)


# Django 6.1's own @task (and the backport's) forwards options it does not know to the
# backend's task_class; Django 6.0's takes none.
DJANGO_TASK_FORWARDS_OPTIONS = any(
    p.kind is inspect.Parameter.VAR_KEYWORD
    for p in inspect.signature(django_task).parameters.values()
)

if DJANGO_TASK_FORWARDS_OPTIONS:

    @django_task(max_attempts=4, backoff=0.5)  # type: ignore[call-overload]
    def via_django_decorator(x: int) -> int:
        return x


@task(backend="immediate")
def runs_at_once(x: int) -> int:
    return x * 10


@task(takes_context=True)
def add_to_previous(context: TaskContext[Any, Any], n: int) -> int:
    """The previous step's result + ``n``: a chain of django.tasks tasks."""
    import django_pgqueue

    return int(django_pgqueue.previous_result(context.task_result.id)) + n


@task
def snooze_once(marker: str) -> str:
    """Snoozes on its first run (it creates ``marker``), then returns ``"woke"``."""
    from pathlib import Path

    import django_pgqueue

    path = Path(marker)
    if not path.exists():
        path.touch()
        raise django_pgqueue.Snooze(0)
    return "woke"
