"""A step: one message to enqueue as part of a chain or a batch, named before it is written.

``step("handler.name", payload, **options)`` for a handler of this app;
``step(task, *args, **kwargs)`` for a ``django.tasks`` task using the django-pgqueue backend
(its options come from ``task.using(...)``: queue, priority, run_after). Both are validated
when the chain or batch is enqueued, before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..core._dependencies import dependency_ids
from ..core._enqueue import MessageOptions, PreparedMessage, prepare_message
from ..exceptions import InvalidMessage

__all__ = ["Step", "step"]


@dataclass(frozen=True)
class Step:
    """What :func:`step` returns: a task and its arguments, not written yet."""

    task: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def is_django_task(self) -> bool:
        return not isinstance(self.task, str)

    def prepare(self, after: tuple[int, ...] = ()) -> PreparedMessage:
        """The message, every check done; ``after``: what it runs after."""
        if self.is_django_task:
            backend = self.task.get_backend()
            prepare = getattr(backend, "prepare", None)
            if prepare is None:
                raise InvalidMessage(
                    f"{self.task.module_path}: its backend ({type(backend).__name__}) is not "
                    "django-pgqueue's; a chain or batch runs on django-pgqueue only"
                )
            _, message = prepare(self.task, list(self.args), self.kwargs)
            return replace(message, after=dependency_ids(after)) if after else message
        payload = self.args[0] if self.args else None
        options = dict(self.kwargs)
        if after:
            options["after"] = after
        return prepare_message(self.task, payload, **options)


def step(task: Any, *args: Any, **kwargs: Any) -> Step:
    """A step of a chain or a batch (see the module's docstring)."""
    if isinstance(task, str):
        if len(args) > 1:
            raise TypeError("step(name, payload, **options): one payload")
        unknown = set(kwargs) - set(MessageOptions.__annotations__)
        if unknown:
            raise TypeError(f"step(): unknown option {sorted(unknown)[0]!r}")
        if "after" in kwargs:
            raise TypeError("step(): a chain or batch sets after= itself")
    elif not (hasattr(task, "module_path") and hasattr(task, "get_backend")):
        raise TypeError(f"step(): {task!r} is neither a handler name nor a django.tasks task")
    return Step(task, tuple(args), dict(kwargs))
