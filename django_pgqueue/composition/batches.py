"""Batches: messages enqueued as one, with callbacks that run once when they have finished.

- ``on_complete`` runs when every member has finished or died;
- ``on_success`` when every member has finished successfully: at completion, or later, once
  the failed members were retried and finished (it is buried meanwhile, reason
  ``dependency_failed``);
- ``on_failure`` at completion when at least one member died (not at all otherwise).

Each runs at most once whatever the number of workers, crashes and redeliveries: the batch's
counts are one row, updated by the statements that archive or bury its members, and its
callbacks are released under that row's lock (``core/_composition_sql.py``). A callback reads
its batch with :func:`~django_pgqueue.composition.results.batch_of`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from django.db import connections, transaction

from ..conf import get_settings
from ..core import _composition_sql as sql
from ..core._composition_models import BATCH_LABEL_MAX_LENGTH
from ..core._enqueue import EnqueuedMessage, hold_message, write_message
from ..exceptions import InvalidMessage
from .chains import Chain, enqueue_chain
from .steps import Step

__all__ = ["EnqueuedBatch", "enqueue_batch"]

#: At most this many members per batch.
MAX_BATCH_MEMBERS = 1_000_000


@dataclass(frozen=True)
class EnqueuedBatch:
    """What :func:`enqueue_batch` wrote."""

    id: int
    #: The message that counts for each member, in order (a chain's last step).
    members: tuple[EnqueuedMessage, ...]
    on_complete: EnqueuedMessage | None = None
    on_success: EnqueuedMessage | None = None
    on_failure: EnqueuedMessage | None = None

    @property
    def member_ids(self) -> list[int]:
        return [m.id for m in self.members]


def enqueue_batch(
    members: Iterable[Step | Chain],
    *,
    on_complete: Step | None = None,
    on_success: Step | None = None,
    on_failure: Step | None = None,
    label: str = "",
    using: str | None = None,
) -> EnqueuedBatch:
    """Write the members, the batch and its callbacks in one transaction (the caller's when
    there is one). Every step is validated before anything is written."""
    planned = list(members)
    if len(planned) > MAX_BATCH_MEMBERS:
        raise InvalidMessage(f"a batch of {len(planned)} members; at most {MAX_BATCH_MEMBERS}")
    if not isinstance(label, str) or len(label) > BATCH_LABEL_MAX_LENGTH:
        raise InvalidMessage(f"label: a string of at most {BATCH_LABEL_MAX_LENGTH} characters")
    for item in planned:
        if not isinstance(item, (Step, Chain)):
            raise TypeError(f"enqueue_batch(): {item!r} is not a step or a chain")
    callbacks = {"on_complete": on_complete, "on_success": on_success, "on_failure": on_failure}
    prepared_callbacks = {
        name: callback.prepare() for name, callback in callbacks.items() if callback is not None
    }
    prepared_members = [
        replace(item.prepare(), composed=True) for item in planned if isinstance(item, Step)
    ]
    if any(message.dedup_key is not None for message in prepared_members):
        # A deduplicated member would be another batch's message, or counted twice.
        raise InvalidMessage("a batch's members cannot have a dedup_key")
    alias = using or get_settings().DATABASE_ALIAS
    written: list[EnqueuedMessage] = []
    with transaction.atomic(using=alias):
        steps = iter(prepared_members)
        for item in planned:
            if isinstance(item, Chain):
                written.append(enqueue_chain(item, using=alias).last)
            else:
                written.append(write_message(next(steps), alias))
        held = {name: hold_message(message, alias) for name, message in prepared_callbacks.items()}
        with connections[alias].cursor() as cursor:
            cursor.execute(
                sql.INSERT_BATCH,
                {
                    "label": label,
                    "total": len(written),
                    **{name: held[name].id if name in held else None for name in callbacks},
                },
            )
            batch_id, _ = cursor.fetchone()
            cursor.execute(
                sql.INSERT_BATCH_MEMBERS, {"members": [m.id for m in written], "batch": batch_id}
            )
            if not written:
                cursor.execute(sql.SETTLE_BATCH, {"batch": batch_id})
    return EnqueuedBatch(
        id=batch_id,
        members=tuple(written),
        on_complete=held.get("on_complete"),
        on_success=held.get("on_success"),
        on_failure=held.get("on_failure"),
    )
