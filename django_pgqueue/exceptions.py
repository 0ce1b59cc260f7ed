"""Every exception django-pgqueue raises on purpose, in one place."""

from __future__ import annotations


class PgQueueError(Exception):
    """Base class of django-pgqueue's own errors."""


class InvalidMessage(PgQueueError, ValueError):
    """A message was refused before anything was written (bad queue, payload, priority...)."""


class QueueNameError(InvalidMessage):
    """A queue name does not match the documented pattern."""


class PayloadError(InvalidMessage):
    """A payload is not JSON-serializable or is larger than ``MAX_PAYLOAD_BYTES``."""


class LeaseError(PgQueueError):
    """A lease operation was used wrongly (e.g. hold-the-lock mode outside a transaction)."""


class ResultNotSerializable(PgQueueError, TypeError):
    """A handler returned what cannot be stored as its message's JSON result: not JSON, a
    string PostgreSQL's ``jsonb`` refuses (U+0000, a lone surrogate), or more than
    ``MAX_RESULT_BYTES``. The message goes to the dead table at once (reason ``error``)."""
