"""django-pgqueue: a fast, durable message queue on the PostgreSQL you already run.

The public API, in one place: enqueue in the caller's transaction (:func:`enqueue`), after it
commits (:func:`enqueue_on_commit`) or in bulk (:func:`enqueue_many`); register handlers
(:func:`handler`) and schedule them (:func:`periodic`); as a consumer of your own, take
messages (:func:`lease`) and :func:`complete`, :func:`fail`, :func:`extend` or :func:`release`
them; :func:`cancel` a message; compose work: ``enqueue(..., after=[...])``,
:func:`enqueue_chain` of :func:`step` s, :func:`enqueue_batch` with callbacks, and read what
they produced (:func:`dependency_results`, :func:`previous_result`, :func:`batch_of`,
:func:`batch_results`); read a running message's progress (:func:`get_progress`); let other
apps veto or hear of retention (:func:`register_retention_guard`, :func:`register_expiry_listener`).
Every error the package raises is a :class:`PgQueueError`; a handler raises :class:`Snooze`
to run again later without spending an attempt.

Names resolve on first use: settings modules and ``INSTALLED_APPS`` import this package before
Django's apps are loaded, when the models cannot be imported yet.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .exceptions import (
    DependencyError,
    InvalidMessage,
    LeaseError,
    PayloadError,
    PgQueueError,
    QueueNameError,
    Snooze,
)

# Imported at once, not on first use: importing the submodule of the same name (the worker
# does) would otherwise leave ``django_pgqueue.periodic`` naming the module. It imports no models.
from .periodic import periodic

if TYPE_CHECKING:
    from .composition.batches import EnqueuedBatch, enqueue_batch
    from .composition.chains import EnqueuedChain, chain, enqueue_chain
    from .composition.results import batch_of, batch_results, dependency_results, previous_result
    from .composition.steps import step
    from .core._cancel import CancelResult, cancel, cancel_many
    from .core._enqueue import (
        EnqueuedMessage,
        MessageOptions,
        enqueue,
        enqueue_many,
        enqueue_on_commit,
    )
    from .core._progress import Progress, get_progress
    from .core._registry import handler
    from .core._retention import register_expiry_listener, register_retention_guard
    from .core.transitions import FailedAttempt, Outcome, complete, extend, fail, release
    from .models import Message

    lease = Message.objects.lease

#: Where each lazily imported name lives.
_HOMES = {
    "EnqueuedBatch": "composition.batches",
    "enqueue_batch": "composition.batches",
    "EnqueuedChain": "composition.chains",
    "chain": "composition.chains",
    "enqueue_chain": "composition.chains",
    "batch_of": "composition.results",
    "batch_results": "composition.results",
    "dependency_results": "composition.results",
    "previous_result": "composition.results",
    "step": "composition.steps",
    "CancelResult": "core._cancel",
    "cancel": "core._cancel",
    "cancel_many": "core._cancel",
    "EnqueuedMessage": "core._enqueue",
    "MessageOptions": "core._enqueue",
    "enqueue": "core._enqueue",
    "enqueue_many": "core._enqueue",
    "enqueue_on_commit": "core._enqueue",
    "handler": "core._registry",
    "Progress": "core._progress",
    "get_progress": "core._progress",
    "register_expiry_listener": "core._retention",
    "register_retention_guard": "core._retention",
    "FailedAttempt": "core.transitions",
    "Outcome": "core.transitions",
    "complete": "core.transitions",
    "extend": "core.transitions",
    "fail": "core.transitions",
    "release": "core.transitions",
}


def __getattr__(name: str) -> Any:
    if name == "lease":
        # ``Message.objects.lease`` as a function: the manager is the one place leasing lives.
        return import_module(f"{__name__}.models").Message.objects.lease
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "CancelResult",
    "DependencyError",
    "EnqueuedBatch",
    "EnqueuedChain",
    "EnqueuedMessage",
    "FailedAttempt",
    "InvalidMessage",
    "LeaseError",
    "MessageOptions",
    "Outcome",
    "PayloadError",
    "PgQueueError",
    "Progress",
    "QueueNameError",
    "Snooze",
    "__version__",
    "batch_of",
    "batch_results",
    "cancel",
    "cancel_many",
    "chain",
    "complete",
    "dependency_results",
    "enqueue",
    "enqueue_batch",
    "enqueue_chain",
    "enqueue_many",
    "enqueue_on_commit",
    "extend",
    "fail",
    "get_progress",
    "handler",
    "lease",
    "periodic",
    "previous_result",
    "register_expiry_listener",
    "register_retention_guard",
    "release",
    "step",
]
