"""``PgQueueTask``: Django's ``Task`` plus the queue's retry and lease options, and a typed
``task`` decorator that accepts them (django-stubs' ``task()`` does not declare ``**kwargs``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, Literal, overload

from .execution import register_task
from .framework import (
    DEFAULT_TASK_BACKEND_ALIAS,
    DEFAULT_TASK_PRIORITY,
    DEFAULT_TASK_QUEUE_NAME,
    Task,
    TaskContext,
)
from .options import TASK_OPTIONS

__all__ = ["TASK_OPTIONS", "PgQueueTask", "task"]


if TYPE_CHECKING:
    # django-stubs declares Task generic; at run time it is not subscriptable.
    class _TaskBase[**P, R](Task[P, R]):
        pass

else:

    class _TaskBase[**P, R](Task):
        __slots__ = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PgQueueTask[**P, R](_TaskBase[P, R]):
    """A task with retry and lease options. ``None`` = the backend's ``OPTIONS``, then ``PGQUEUE``.

    - ``max_attempts``: runs before the task is FAILED (1 = no retry).
    - ``backoff``: seconds before the first retry, doubling per attempt (``BACKOFF_BASE``).
    - ``backoff_max``: cap of the retry delay in seconds (``BACKOFF_MAX``).
    - ``timeout``: seconds one attempt may run before it counts as failed (``TASK_TIMEOUT``).
    - ``visibility_timeout``: seconds a worker's lease hides the task; a worker that dies
      gives it back after this long (``VISIBILITY_TIMEOUT``).

    Creating one registers it with the worker under its ``module_path`` (the worker never
    imports a dotted path read from a row).
    """

    max_attempts: int | None = None
    backoff: float | None = None
    backoff_max: float | None = None
    timeout: float | None = None
    visibility_timeout: float | None = None

    def __post_init__(self) -> None:
        # Zero-argument super() does not work in a slots dataclass before Python 3.14.
        Task.__post_init__(self)
        register_task(self)


@overload
def task[**P, R](
    function: Callable[Concatenate[TaskContext[Any, Any], P], R],
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: Literal[True],
    max_attempts: int | None = ...,
    backoff: float | None = ...,
    backoff_max: float | None = ...,
    timeout: float | None = ...,
    visibility_timeout: float | None = ...,
) -> PgQueueTask[P, R]: ...
@overload
def task[**P, R](
    function: Callable[P, R],
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: Literal[False] = False,
    max_attempts: int | None = ...,
    backoff: float | None = ...,
    backoff_max: float | None = ...,
    timeout: float | None = ...,
    visibility_timeout: float | None = ...,
) -> PgQueueTask[P, R]: ...
@overload
def task[**P, R](
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: Literal[True],
    max_attempts: int | None = ...,
    backoff: float | None = ...,
    backoff_max: float | None = ...,
    timeout: float | None = ...,
    visibility_timeout: float | None = ...,
) -> Callable[[Callable[Concatenate[TaskContext[Any, Any], P], R]], PgQueueTask[P, R]]: ...
@overload
def task[**P, R](
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: Literal[False] = False,
    max_attempts: int | None = ...,
    backoff: float | None = ...,
    backoff_max: float | None = ...,
    timeout: float | None = ...,
    visibility_timeout: float | None = ...,
) -> Callable[[Callable[P, R]], PgQueueTask[P, R]]: ...
def task(
    function: Callable[..., Any] | None = None,
    *,
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    max_attempts: int | None = None,
    backoff: float | None = None,
    backoff_max: float | None = None,
    timeout: float | None = None,
    visibility_timeout: float | None = None,
) -> Any:
    """``django.tasks.task`` with the queue's options, typed.

    Always builds a :class:`PgQueueTask` (or the backend's own subclass of it), so a module
    using it still imports when ``TASKS`` points at another backend, e.g. Django's
    ``ImmediateBackend`` in tests: the options are then carried and ignored.
    """
    from .framework import task_backends

    def wrap(func: Callable[..., Any]) -> PgQueueTask[Any, Any]:
        task_class = task_backends[backend].task_class
        if not (isinstance(task_class, type) and issubclass(task_class, PgQueueTask)):
            task_class = PgQueueTask
        return task_class(
            func=func,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            run_after=None,  # Django 6.0's Task has no default for it
            max_attempts=max_attempts,
            backoff=backoff,
            backoff_max=backoff_max,
            timeout=timeout,
            visibility_timeout=visibility_timeout,
        )

    if function is not None:
        return wrap(function)
    return wrap
