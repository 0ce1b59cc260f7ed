"""The ``extra`` fields of every log record about one message, so that a JSON log
formatter writes them as fields of their own (how-to "Run workers": structured logs)."""

from __future__ import annotations

from typing import Any


def message_fields(message: Any) -> dict[str, Any]:
    """``message_id``, ``task``, ``queue`` and ``attempt`` of ``message`` (a leased
    ``Message``), for a log call's ``extra``."""
    return {
        "message_id": message.id,
        "task": message.task,
        "queue": message.queue,
        "attempt": message.attempts,
    }


def batch_fields(message_ids: list[int]) -> dict[str, Any]:
    """``message_ids`` of a record about several messages (a batch that lost its leases)."""
    return {"message_ids": list(message_ids)}
