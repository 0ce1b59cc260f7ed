"""Enqueue a message that runs only after others finished successfully (``after=``).

The message waits in ``pgqueue_waiting``, out of every claim's sight, with the count of its
dependencies not finished yet; the statement that archives the last of them moves it into the
live table, and one that buries any of them buries it too (``_composition_sql.py`` says how,
and why no race loses a release). A dependency may be live, waiting itself, finished (nothing
to wait for: its result is still readable) or dead (the message is buried at once, and comes
back if that one is retried).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connections, transaction

from ..exceptions import DependencyError
from . import _composition_sql as sql

#: At most this many dependencies per message (a batch's callback has no such bound).
MAX_DEPENDENCIES = 1000

# A dependency moves from the waiting table to the live one at most once between two looks;
# a few rounds find every one that exists.
_LOOKUP_ROUNDS = 3


def dependency_ids(after: Iterable[Any]) -> tuple[int, ...]:
    """Message ids from what ``after=`` takes: ids, or what enqueue returned (anything with an
    ``id`` that is one: an ``EnqueuedMessage``, a Tasks ``TaskResult``)."""
    if isinstance(after, (str, bytes)) or not isinstance(after, Iterable):
        raise DependencyError("after= takes a list of messages (ids or what enqueue returned)")
    ids: list[int] = []
    for item in after:
        value = getattr(item, "id", item)
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise DependencyError(f"after=: {item!r} is not a message or a message id")
        ids.append(value)
    if not ids:
        raise DependencyError("after= is empty: leave it out to enqueue without dependencies")
    if len(ids) > MAX_DEPENDENCIES:
        raise DependencyError(
            f"after= lists {len(ids)} messages; at most {MAX_DEPENDENCIES} "
            "(for more, enqueue them as a batch with a callback)"
        )
    return tuple(dict.fromkeys(ids))


def write_waiting(
    params: dict[str, Any], after: tuple[int, ...], using: str
) -> tuple[int, Any, Any]:
    """Write a message that waits for ``after``: ``(id, enqueued_at, available_at)``, the last
    ``None`` while it waits (or was buried at once, a dependency being dead). ``params``: the
    enqueue's (``_enqueue.write_message``) plus ``fair``. When every dependency has finished
    already it is released at once, as it would have been by the last of them."""
    connection = connections[using]
    with transaction.atomic(using=using), connection.cursor() as cursor:
        waiting_or_live, finished, dead = _locate(cursor, after)
        missing = set(after) - waiting_or_live - finished - dead
        if missing:
            raise DependencyError(f"after=: no message has the id {sorted(missing)[0]}")
        cursor.execute(
            sql.INSERT_WAITING,
            {**params, "pending": len(waiting_or_live) + len(dead), "delay": params["delay"]},
        )
        message_id, enqueued_at = cursor.fetchone()
        cursor.execute(
            sql.INSERT_DEPENDENCIES, {"prerequisites": list(after), "dependent": message_id}
        )
        if dead:
            # Buried as if it had been waiting when they died: it comes back with them.
            cursor.execute(sql.MARK_DEAD_COMPOSED, {"ids": sorted(dead)})
            cursor.execute(sql.BURY_DEPENDENTS_OF, {"ids": sorted(dead)})
            return message_id, enqueued_at, None
        if waiting_or_live:
            return message_id, enqueued_at, None
        cursor.execute(sql.RELEASE, {"ids": [message_id]})
        cursor.execute(sql.AVAILABLE_AT, {"id": message_id})
        return message_id, enqueued_at, cursor.fetchone()[0]


def write_held(params: dict[str, Any], using: str) -> tuple[int, Any]:
    """Write a message that waits for its batch, which releases it: ``(id, enqueued_at)``."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.INSERT_WAITING, {**params, "pending": 1})
        message_id, enqueued_at = cursor.fetchone()
    return message_id, enqueued_at


def _locate(cursor: Any, ids: tuple[int, ...]) -> tuple[set[int], set[int], set[int]]:
    """``(waiting or live, finished, dead)`` among ``ids``, the first set locked."""
    held: set[int] = set()
    finished: set[int] = set()
    dead: set[int] = set()
    unseen = list(ids)
    for _ in range(_LOOKUP_ROUNDS):
        cursor.execute(sql.LOCK_DEPENDENCIES, {"ids": unseen})
        held.update(row[0] for row in cursor.fetchall())
        unseen = [i for i in unseen if i not in held]
        if not unseen:
            break
        cursor.execute(sql.ENDED_DEPENDENCIES, {"ids": unseen})
        for message_id, succeeded in cursor.fetchall():
            (finished if succeeded else dead).add(message_id)
        unseen = [i for i in unseen if i not in finished and i not in dead]
        if not unseen:
            break
    return held, finished, dead
