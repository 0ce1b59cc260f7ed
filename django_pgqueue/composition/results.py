"""What a composed message reads: its dependencies' results, its batch and the batch's."""

from __future__ import annotations

import json
from typing import Any

from django.db import connections
from django.db.models import Q

from ..conf import get_settings
from ..core._composition_models import Batch

__all__ = ["batch_of", "batch_results", "dependency_results", "previous_result"]

_DEPENDENCY_RESULTS = """
SELECT a.message_id, a.result::text
FROM pgqueue_dependency d JOIN pgqueue_archive a ON a.message_id = d.prerequisite_id
WHERE d.dependent_id = %s
ORDER BY d.prerequisite_id
"""

_MEMBER_RESULTS = """
SELECT a.message_id, a.result::text
FROM pgqueue_batch_member m JOIN pgqueue_archive a ON a.message_id = m.message_id
WHERE m.batch_id = %s
ORDER BY m.message_id
"""


def _decoded(rows: list[tuple[int, str | None]]) -> dict[int, Any]:
    return {message_id: None if text is None else json.loads(text) for message_id, text in rows}


def _alias(using: str | None) -> str:
    return using or get_settings().DATABASE_ALIAS


def _message_id(message: Any) -> int:
    """An id from an id, a handler's context, or a Tasks context (``task_result.id``)."""
    value = getattr(message, "message_id", None)
    if value is None and hasattr(message, "task_result"):
        value = message.task_result.id
    value = message if value is None else value
    return int(value)


def dependency_results(message: Any, *, using: str | None = None) -> dict[int, Any]:
    """The results of what ``message`` ran after (``after=``, the previous step of a chain),
    by message id, in id order. Readable while the message runs: a finished message no longer
    keeps its dependencies, and an archive past its retention no longer has the results."""
    with connections[_alias(using)].cursor() as cursor:
        cursor.execute(_DEPENDENCY_RESULTS, [_message_id(message)])
        return _decoded(cursor.fetchall())


def previous_result(message: Any, *, using: str | None = None) -> Any:
    """The result of the one message ``message`` ran after: a chain's previous step.
    ``LookupError`` when it has none or several."""
    results = dependency_results(message, using=using)
    if len(results) != 1:
        raise LookupError(
            f"message {_message_id(message)} ran after {len(results)} messages, not one"
        )
    return next(iter(results.values()))


def batch_of(message: Any, *, using: str | None = None) -> Batch | None:
    """The batch ``message`` (an id or a context) is a member or a callback of, if any."""
    message_id = _message_id(message)
    batches = Batch.objects.using(_alias(using))
    member = batches.filter(members__message_id=message_id).first()
    if member is not None:
        return member
    return batches.filter(
        Q(on_complete_id=message_id) | Q(on_success_id=message_id) | Q(on_failure_id=message_id)
    ).first()


def batch_results(batch: Batch | int, *, using: str | None = None) -> dict[int, Any]:
    """The results of the batch's members that finished, by message id."""
    batch_id = batch.id if isinstance(batch, Batch) else int(batch)
    with connections[_alias(using)].cursor() as cursor:
        cursor.execute(_MEMBER_RESULTS, [batch_id])
        return _decoded(cursor.fetchall())
