"""Handlers by registered name. The worker dispatches only through this registry: a task name
read from a row is looked up here and never imported as a dotted path. It lives in the core
because enqueue (per-handler defaults) and dead-lettering (``on_dead`` hooks) consult it too."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ._validation import validate_max_attempts, validate_queue_name, validate_task_name

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("django_pgqueue.worker")


@dataclass(frozen=True)
class Handler:
    """A registered handler and its per-task options (``None`` = the queue's / global value)."""

    name: str
    func: Callable[..., Any]
    is_async: bool
    takes_context: bool
    queue: str | None = None
    max_attempts: int | None = None
    timeout: float | None = None
    visibility_timeout: float | None = None
    backoff_base: float | None = None
    backoff_max: float | None = None
    #: Most snoozes of one message (``raise Snooze``); ``None``: ``MAX_SNOOZES``.
    max_snoozes: int | None = None
    #: Called with (message id, dead reason) after a worker buried one of this handler's
    #: messages: its last attempt timed out, raised, or its lease expired. Must not raise.
    on_dead: Callable[[int, str], None] | None = None


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, handler: Handler) -> None:
        existing = self._handlers.get(handler.name)
        if existing is not None and existing.func is not handler.func:
            raise ValueError(
                f"A handler named {handler.name!r} is already registered "
                f"({existing.func.__module__}.{existing.func.__qualname__})."
            )
        self._handlers[handler.name] = handler

    def unregister(self, name: str) -> None:
        self._handlers.pop(name, None)

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def handlers(self) -> list[Handler]:
        return list(self._handlers.values())


registry = HandlerRegistry()


def handler(
    name: str,
    *,
    queue: str | None = None,
    max_attempts: int | None = None,
    timeout: float | None = None,
    visibility_timeout: float | None = None,
    backoff_base: float | None = None,
    backoff_max: float | None = None,
    max_snoozes: int | None = None,
) -> Callable[[F], F]:
    """Register a sync or async function as the handler of task ``name``.

    The function receives the payload; if its first parameter is named ``context`` it gets a
    :class:`~django_pgqueue.worker.context.MessageContext` first (message id, attempt,
    ``extend_lease()``). ``max_snoozes``: how many times one message may snooze
    (``raise django_pgqueue.Snooze(seconds)``; default ``MAX_SNOOZES``).
    """
    validate_task_name(name)
    if queue is not None:
        validate_queue_name(queue)
    if max_attempts is not None:
        validate_max_attempts(max_attempts)
    for label, value in (("timeout", timeout), ("visibility_timeout", visibility_timeout)):
        if value is not None and value <= 0:
            raise ValueError(f"{label} must be > 0 seconds")
    if max_snoozes is not None and (
        not isinstance(max_snoozes, int) or isinstance(max_snoozes, bool) or max_snoozes < 0
    ):
        raise ValueError(f"max_snoozes must be a whole number >= 0; got {max_snoozes!r}")

    def decorate(func: F) -> F:
        params = list(inspect.signature(func).parameters)
        registry.register(
            Handler(
                name=name,
                func=func,
                is_async=inspect.iscoroutinefunction(func),
                takes_context=bool(params) and params[0] == "context",
                queue=queue,
                max_attempts=max_attempts,
                timeout=timeout,
                visibility_timeout=visibility_timeout,
                backoff_base=backoff_base,
                backoff_max=backoff_max,
                max_snoozes=max_snoozes,
            )
        )
        return func

    return decorate


def notify_dead(task: str, message_id: int, reason: str) -> None:
    """Tell ``task``'s handler, if it asked, that one of its messages was dead-lettered."""
    handler = registry.get(task)
    if handler is None or handler.on_dead is None:
        return
    try:
        handler.on_dead(message_id, reason)
    except Exception:
        logger.exception("on_dead hook of %s failed for message %s", task, message_id)
