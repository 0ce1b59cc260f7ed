"""Cancel messages by id: the ones no worker holds leave at once, the running ones are flagged.

A message that is not held (never leased, scheduled, backing off, or its lease expired) moves
to the dead table with reason ``cancelled`` in one statement. A message a worker holds cannot
be stopped from outside (a Python thread cannot be killed), so it is flagged instead: its
handler sees ``context.cancel_requested`` after the worker's next lease extension, and if it
then raises, the message is buried with reason ``cancelled`` instead of being retried. A
flagged handler that returns normally is archived: its work is done.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from django.db import connections

from ..conf import get_settings
from . import _sql

__all__ = ["CancelResult", "cancel", "cancel_many"]


class CancelResult(enum.StrEnum):
    """What :func:`cancel` did to one message."""

    CANCELLED = "cancelled"  # moved to the dead table (reason ``cancelled``)
    FLAGGED = "flagged"  # a worker holds it; its handler is told at the next extension
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
        cursor.execute(_sql.CANCEL, [ids, note])
        found = {message_id: CancelResult(what) for message_id, what in cursor.fetchall()}
    return {i: found.get(i, CancelResult.NOT_FOUND) for i in ids}


def cancel(
    message_id: int, *, note: str = "cancelled by django_pgqueue.cancel()", using: str | None = None
) -> CancelResult:
    """Cancel one live message (see the module's docstring for what happens when)."""
    return cancel_many([message_id], note=note, using=using)[int(message_id)]
