"""Drive messages by hand (lease, complete, fail) and say where a message is."""

from __future__ import annotations

from typing import Any

from django.db import connection

from django_pgqueue.core import transitions
from django_pgqueue.core.transitions import FailedAttempt, error_entry
from django_pgqueue.models import DeadMessage, Message, WaitingMessage


def lease_all(queue: str = "default") -> list[Message]:
    return list(Message.objects.lease(queue, worker_id="w1", batch_size=1000))


def finish(*ids: int, queue: str = "default", result: Any = None) -> None:
    """Lease and complete exactly these messages (they must be claimable now)."""
    leases = [m for m in lease_all(queue) if m.id in ids]
    assert sorted(m.id for m in leases) == sorted(ids)
    transitions.complete(leases, results=[result] * len(leases))
    # Whatever else was leased goes back.
    others = [m for m in Message.objects.filter(queue=queue, lease_token__isnull=False)]
    if others:
        transitions.release(others)


def bury(message_id: int, queue: str = "default") -> None:
    """Lease the message and fail it for good."""
    [lease] = [m for m in lease_all(queue) if m.id == message_id]
    error = error_entry(ValueError("boom"), attempt=lease.attempts)
    transitions.fail([FailedAttempt(lease=lease, error=error, retry_in=None)])
    others = [m for m in Message.objects.filter(queue=queue, lease_token__isnull=False)]
    if others:
        transitions.release(others)


def where(message_id: int) -> str:
    """live, waiting, dead, finished or nowhere."""
    for name, model, field in (
        ("live", Message, "id"),
        ("waiting", WaitingMessage, "id"),
        ("dead", DeadMessage, "message_id"),
    ):
        if model.objects.filter(**{field: message_id}).exists():
            return name
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pgqueue_archive WHERE message_id = %s", [message_id])
        if cursor.fetchone():
            return "finished"
    return "nowhere"
