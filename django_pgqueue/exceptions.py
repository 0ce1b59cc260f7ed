"""Every exception django-pgqueue raises on purpose, in one place, under one base:
:class:`PgQueueError`. Where callers expect a built-in kind too, a class is both.

Two live elsewhere: ``django_pgqueue.tasks.InvalidTaskMessage``, which is also the Tasks
framework's ``InvalidTask`` (an optional dependency this module must import without), and
a private signal inside the pipeline's prune.
"""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import ImproperlyConfigured


class PgQueueError(Exception):
    """Base class of django-pgqueue's own errors."""


# -- messages and leases ----------------------------------------------------------------------


class InvalidMessage(PgQueueError, ValueError):
    """A message was refused before anything was written (bad queue, payload, priority...)."""


class QueueNameError(InvalidMessage):
    """A queue name does not match the documented pattern."""


class PayloadError(InvalidMessage):
    """A payload is not JSON-serializable or is larger than ``MAX_PAYLOAD_BYTES``."""


class DependencyError(InvalidMessage):
    """A message's dependencies cannot be used: an id that names no message, too many of them,
    or options a dependent cannot have (a dedup key)."""


class LeaseError(PgQueueError):
    """A lease operation was used wrongly (e.g. hold-the-lock mode outside a transaction)."""


class ResultNotSerializable(PgQueueError, TypeError):
    """A handler returned what cannot be stored as its message's JSON result: not JSON, a
    string PostgreSQL's ``jsonb`` refuses (U+0000, a lone surrogate), or more than
    ``MAX_RESULT_BYTES``. The message goes to the dead table at once (reason ``error``)."""


# -- settings ---------------------------------------------------------------------------------


class SettingsError(PgQueueError, ImproperlyConfigured):
    """``PGQUEUE`` holds a key or value this version does not accept.

    ``check_id`` names the system check that reports the same problem.
    """

    def __init__(self, message: str, check_id: str) -> None:
        super().__init__(message)
        self.check_id = check_id


# -- recorded on a django.tasks result --------------------------------------------------------


class LeaseExpired(PgQueueError, TimeoutError):
    """A worker's lease ran out before it reported (it crashed, or was stopped hard)."""


class TaskTimeout(PgQueueError, TimeoutError):
    """An attempt ran longer than the task's ``timeout``."""


class TaskRejected(PgQueueError, LookupError):
    """The worker had no handler for the task (its module was not imported there)."""


# -- inside the worker ------------------------------------------------------------------------


class Snooze(PgQueueError):
    """Raised by a handler: run this message again ``seconds`` from now (a number or a
    timedelta, from 0 to a year), without spending an attempt. A request to the worker, not
    an error: the package never raises it.

    The worker gives back the attempt the claim counted and counts a snooze instead; past
    the handler's ``max_snoozes`` (default ``MAX_SNOOZES``) the message goes to the dead table
    with reason ``error`` (:class:`SnoozeLimitExceeded`). A message ``cancel()`` flagged is
    buried with reason ``cancelled`` instead of snoozed.
    """

    def __init__(self, seconds: float | timedelta) -> None:
        value = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not 0 <= value <= SNOOZE_MAX_SECONDS
        ):
            raise ValueError(
                f"Snooze(seconds) takes a timedelta or a number of seconds from 0 to a year "
                f"({SNOOZE_MAX_SECONDS:.0f}); got {seconds!r}."
            )
        super().__init__(float(value))
        self.seconds = float(value)


#: The longest snooze: a year (as ``unique_for`` and ``debounce``).
SNOOZE_MAX_SECONDS = 366 * 86400.0


class SnoozeLimitExceeded(PgQueueError):
    """Recorded on a dead message whose handler snoozed it more than ``max_snoozes`` times."""


class HandlerTimeout(PgQueueError):
    """The handler ran past its per-message timeout."""


class Stopped(PgQueueError):
    """Raised out of a retry loop when the worker is told to stop at once."""


# -- the Spark pipeline (its command prints the message as is) --------------------------------


class PipelineError(PgQueueError):
    """A pipeline job refused or failed for a reason an operator can act on."""


class SparkUnavailable(PipelineError, ImproperlyConfigured):
    """pyspark, Java or the PostgreSQL JDBC driver is missing."""


class MasterUnreachable(PipelineError):
    """The Spark master URL given does not answer."""


class ForeignOutput(PipelineError):
    """The export destination holds files this pipeline did not write."""


class DestinationBusy(PipelineError):
    """Another export run holds the destination's lease."""


class LeaseLost(PipelineError):
    """This run's lease on its destination expired or was taken over; it stops committing."""


class ForeignTableEntry(PipelineError):
    """An export table's log lists a file the export would never write there; nothing is read
    or deleted."""


class NotPrunable(PipelineError):
    """Prune refused: what it would delete is not (or no longer) verifiably exported."""


class NoVerifiedExport(PipelineError):
    """Prune was asked to delete rows that no completed export verified."""


class BadInput(PipelineError):
    """Bulk-enqueue input rows failed validation; ``bad_rows`` lists (row number, reason)."""

    def __init__(self, message: str, bad_rows: list[tuple[int, str]], bad_count: int) -> None:
        super().__init__(message)
        self.bad_rows = bad_rows
        self.bad_count = bad_count
