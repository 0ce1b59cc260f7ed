"""The failed attempts the executor reports: a handler's error or timeout, and a message that
cancel() flagged before its handler started."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core import transitions
from ..exceptions import HandlerTimeout, ResultNotSerializable
from ..models import DeadReason
from .storable import describe_exception

if TYPE_CHECKING:
    from .executor import Job


def handler_failed(
    job: Job, exc: BaseException, *, worker_id: str, max_message: int, max_traceback: int
) -> transitions.FailedAttempt:
    """The attempt ``exc`` failed: retried after the handler's backoff, or buried."""
    message = job.message
    timed_out = isinstance(exc, HandlerTimeout)
    handler = job.handler
    delay = transitions.backoff_delay(
        message.attempts, base=handler.backoff_base, maximum=handler.backoff_max
    )
    type_name, text, trace = describe_exception(
        exc, max_message=max_message, max_traceback=max_traceback
    )
    entry = transitions.error_entry(
        attempt=message.attempts,
        worker_id=worker_id,
        type_name="Timeout" if timed_out else type_name,
        message=text,
        traceback=trace,
    )
    return transitions.FailedAttempt(
        lease=message,
        error=entry,
        # Running it again would repeat its effects only to refuse the result again.
        retry_in=None if isinstance(exc, ResultNotSerializable) else delay,
        final_reason=DeadReason.TIMEOUT if timed_out else DeadReason.ERROR,
    )


def cancelled_before_start(job: Job, *, worker_id: str) -> transitions.FailedAttempt:
    """The failure that buries a message cancel() flagged before its handler started."""
    message = job.message
    entry = transitions.error_entry(
        attempt=message.attempts,
        worker_id=worker_id,
        type_name="Cancelled",
        message="cancel requested before its handler started; it was not run",
    )
    return transitions.FailedAttempt(
        lease=message, error=entry, retry_in=None, final_reason=DeadReason.CANCELLED
    )
