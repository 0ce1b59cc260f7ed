"""What an enqueue with ``unique_for`` or ``debounce`` sends before (or instead of) its INSERT.

``unique_for``: the first enqueue of a queue's key takes a window of that many seconds
(``pgqueue_unique_window``); every enqueue of the key with ``unique_for`` until the window
expires returns the first message, whether it still waits, runs, finished or died. The
window is a row written in the caller's transaction: a rollback frees it, and a concurrent
enqueue of the key waits for that transaction to end.

``debounce``: the key's message that has not started takes the new payload and starts
``debounce`` seconds from now; once it has started (a worker leased it) or left the live
table, a new message is written. One key's debounced enqueues wait for each other's
transactions (an advisory lock), so two of them never both write a new message.

Both run inside one transaction (the caller's, or one of their own): the statements of one
enqueue commit or roll back together.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from ..conf import get_settings
from . import _job_control_sql as sql
from ._flow_control import flow_config
from ._notify import wake_payload

if TYPE_CHECKING:
    from ._enqueue import PreparedMessage

__all__ = ["Holder", "debounce", "record_window_holder", "take_window"]


class Holder(NamedTuple):
    """The message an enqueue returns instead of writing one."""

    id: int
    task: str
    enqueued_at: datetime
    available_at: datetime | None


def take_window(cursor: Any, message: PreparedMessage) -> Holder | None:
    """Take the message's key's window for ``unique_for`` seconds (None: taken, enqueue the
    message and record it), or return the message that holds it."""
    params = {"queue": message.queue, "key": message.dedup_key, "window": message.unique_for}
    for _ in range(3):
        cursor.execute(sql.TAKE_WINDOW, params)
        row = cursor.fetchone()
        if row is None:  # held by a transaction that committed after this statement began
            cursor.execute(sql.WINDOW_HOLDER, params)
            row = cursor.fetchone()
        if row is not None:  # else the window was deleted in between (it had expired)
            return None if row[0] else Holder(*row[1:])
    raise RuntimeError(
        f"the unique window of {message.dedup_key!r} in {message.queue!r} was neither taken "
        "nor held"
    )


def record_window_holder(cursor: Any, message: PreparedMessage, holder: Holder) -> None:
    """The message just written (or found live by its dedup key) holds the window."""
    cursor.execute(
        sql.RECORD_WINDOW_HOLDER,
        {
            "queue": message.queue,
            "key": message.dedup_key,
            "id": holder.id,
            "task": holder.task,
            "enqueued_at": holder.enqueued_at,
            "available_at": holder.available_at,
        },
    )


def debounce(cursor: Any, message: PreparedMessage) -> tuple[Holder, bool]:
    """Push back the key's waiting message with the new payload, or write a new one: the
    message, and whether it was an earlier one (pushed back)."""
    conf = get_settings()
    flow = flow_config(message.queue)
    params = {
        "queue": message.queue,
        "key": message.dedup_key,
        "task": message.task,
        "payload": message.payload_json,
        "headers": message.headers_json,
        "priority": message.priority,
        "tenant": message.tenant,
        "max_attempts": message.max_attempts,
        "debounce": message.debounce,
        # In a fair queue a scheduled message waits outside the fair order.
        "fair_order": -1.0 if flow is not None and flow.keyed else None,
        "channel": conf.NOTIFY_CHANNEL if conf.NOTIFY else None,
        "wake": wake_payload(message.queue, later=True) if conf.NOTIFY else None,
    }
    cursor.execute(sql.DEBOUNCE_LOCK, params)
    cursor.execute(sql.DEBOUNCE, params)
    message_id, enqueued_at, available_at, pushed, _ = cursor.fetchone()
    return Holder(message_id, message.task, enqueued_at, available_at), pushed
