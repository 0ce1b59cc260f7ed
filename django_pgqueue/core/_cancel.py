"""Cancel messages by id: the ones no worker holds leave at once, the running ones are flagged.

A message that is not held (never leased, scheduled, backing off, waiting on dependencies, or its lease expired) moves
to the dead table with reason ``cancelled`` in one statement. A message a worker holds cannot
be stopped from outside (a Python thread cannot be killed), so it is flagged instead, and its
worker is told by a notification (and reads the flags at every lease extension anyway). A
flagged message whose handler has not started when its worker sees the flag never starts: it
is buried with reason ``cancelled``. A running handler sees ``context.cancel_requested``; if
it then raises, the message is buried with reason ``cancelled`` instead of being retried. A
flagged handler that returns normally is archived: its work is done.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from django.db import connections

from ..conf import get_settings
from . import _sql
from ._notify import notify_cancel

__all__ = ["CancelResult", "cancel", "cancel_many"]


class CancelResult(enum.StrEnum):
    """What :func:`cancel` did to one message."""

    CANCELLED = "cancelled"  # moved to the dead table (reason ``cancelled``)
    FLAGGED = "flagged"  # a worker holds it: told, it runs it not at all or tells its handler
    NOT_FOUND = "not_found"  # not live: finished, dead, cancelled already, or never existed


def cancel_many(
    message_ids: Sequence[int],
    *,
    note: str = "cancelled by django_pgqueue.cancel()",
    using: str | None = None,
) -> dict[int, CancelResult]:
    """Cancel each message; returns what happened to each id, in the order given."""
    ids = [int(i) for i in message_ids]
    if not ids:
        return {}
    alias = using or get_settings().DATABASE_ALIAS
    with connections[alias].cursor() as cursor:
        cursor.execute(_sql.CANCEL, [ids, note, ids, note])
        rows = cursor.fetchall()
    found = {message_id: CancelResult(what) for message_id, what, _ in rows}
    # The workers holding a flagged message hear of it now, not at their next heartbeat: a
    # handler that has not started by then never starts.
    notify_cancel({holder for _, _, holder in rows if holder}, using=alias)
    return {i: found.get(i, CancelResult.NOT_FOUND) for i in ids}


def cancel(
    message_id: int, *, note: str = "cancelled by django_pgqueue.cancel()", using: str | None = None
) -> CancelResult:
    """Cancel one live message (see the module's docstring for what happens when)."""
    return cancel_many([message_id], note=note, using=using)[int(message_id)]
