"""django-pgqueue: a fast, durable message queue on the PostgreSQL you already run.

The public API is small: enqueue in the caller's transaction (:func:`enqueue`), after it
commits (:func:`enqueue_on_commit`) or in bulk (:func:`enqueue_many`), register handlers
(:func:`handler`), schedule them (:func:`periodic`) and cancel messages (:func:`cancel`). Leasing and transitions live on ``Message.objects`` and in
``django_pgqueue.core``.
"""

from ._version import __version__
from .core.cancel import CancelResult, cancel, cancel_many
from .core.enqueue import EnqueuedMessage, enqueue, enqueue_many, enqueue_on_commit
from .exceptions import InvalidMessage, LeaseError, PayloadError, PgQueueError, QueueNameError
from .periodic import periodic
from .worker.registry import handler

__all__ = [
    "CancelResult",
    "EnqueuedMessage",
    "InvalidMessage",
    "LeaseError",
    "PayloadError",
    "PgQueueError",
    "QueueNameError",
    "__version__",
    "cancel",
    "cancel_many",
    "enqueue",
    "enqueue_many",
    "enqueue_on_commit",
    "handler",
    "periodic",
]
