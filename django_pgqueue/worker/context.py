"""What a handler that asks for it (first parameter named ``context``) receives."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType

from ..core._progress import check_progress

#: ``headers`` of a message that has none.
NO_HEADERS: Mapping[str, str] = MappingProxyType({})


@dataclass
class MessageContext:
    """The message being handled and a way to keep its lease.

    ``attempt`` starts at 1 and counts this run. ``extend_lease(seconds)`` pushes the lease
    expiry to database now + ``seconds`` and returns False when the lease was lost (another
    worker holds the message now: stop and do not repeat side effects). ``abandoned`` turns
    True once the worker has given this run up (its timeout or the shutdown grace period ran
    out: the attempt is already failed or released, and what the handler returns is dropped).
    ``cancel_requested`` turns True once ``django_pgqueue.cancel()`` flagged the message, seen
    when the worker hears of it (a notification, its heartbeat, or ``extend_lease()``): stop
    early and raise, and the message is buried with reason ``cancelled`` instead of retried.
    ``report_progress(done, total, note=...)`` records how far the handler got, for
    ``django_pgqueue.get_progress()``, the admin and ``pgq_status``. ``headers`` are the
    message's headers (``enqueue(headers=...)``, the trace context among them), read-only,
    empty when it has none.
    """

    message_id: int
    task: str
    queue: str
    attempt: int
    max_attempts: int
    worker_id: str
    lease_token: uuid.UUID
    enqueued_at: datetime | None = None
    tenant: str | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: NO_HEADERS)
    _extend: Callable[[float], bool] | None = field(default=None, repr=False)
    _abandoned: Callable[[], bool] | None = field(default=None, repr=False)
    _cancel_requested: Callable[[], bool] | None = field(default=None, repr=False)
    _report_progress: Callable[[int, int | None, str], None] | None = field(
        default=None, repr=False
    )

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    @property
    def abandoned(self) -> bool:
        return self._abandoned is not None and self._abandoned()

    @property
    def cancel_requested(self) -> bool:
        return self._cancel_requested is not None and self._cancel_requested()

    def report_progress(self, done: int, total: int | None = None, *, note: str = "") -> None:
        """Report that ``done`` of ``total`` units are done (``total`` None: unknown), with
        a short ``note`` (at most 200 characters). Cheap and non-blocking, in sync and async
        handlers alike: the worker keeps the latest report and writes it at most every
        ``PROGRESS_INTERVAL`` seconds, apart from the message's row. Bad values raise
        ``TypeError`` or ``ValueError`` here."""
        if self._report_progress is None:
            raise RuntimeError("report_progress() is only available inside a worker")
        self._report_progress(*check_progress(done, total, note))

    def extend_lease(self, seconds: float) -> bool:
        if self._extend is None:
            raise RuntimeError("extend_lease() is only available inside a worker")
        return self._extend(seconds)
