"""cancel(): not held -> dead (reason cancelled) at once; held -> flagged for its handler."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

import django_pgqueue
from django_pgqueue import CancelResult
from django_pgqueue.core import transitions
from django_pgqueue.core.transitions import FailedAttempt, error_entry
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message

pytestmark = pytest.mark.django_db(transaction=True)


def lease_one(**kwargs: object) -> Message:
    [message] = Message.objects.lease("default", worker_id="w1", **kwargs)  # type: ignore[arg-type]
    return message


def test_a_ready_message_goes_to_dead_with_reason_cancelled_at_once() -> None:
    sent = django_pgqueue.enqueue("t", {"p": 1}, dedup_key="k")
    assert django_pgqueue.cancel(sent.id) == CancelResult.CANCELLED
    assert not Message.objects.filter(pk=sent.id).exists()
    dead = DeadMessage.objects.get(message_id=sent.id)
    assert dead.reason == "cancelled" and dead.payload == {"p": 1}
    assert dead.details["type"] == "Cancelled"
    # The dedup key is free again: the same work can be enqueued anew.
    assert django_pgqueue.enqueue("t", {"p": 2}, dedup_key="k").id != sent.id


def test_a_scheduled_message_is_cancelled_too() -> None:
    sent = django_pgqueue.enqueue("t", {}, run_after=dt.timedelta(hours=1))
    assert django_pgqueue.cancel(sent.id) == "cancelled"
    assert DeadMessage.objects.get(message_id=sent.id).reason == "cancelled"


def test_unknown_or_finished_ids_are_not_found() -> None:
    sent = django_pgqueue.enqueue("t", {})
    transitions.complete([lease_one()])
    assert django_pgqueue.cancel(sent.id) == CancelResult.NOT_FOUND
    assert django_pgqueue.cancel(987654321) == CancelResult.NOT_FOUND
    assert ArchivedMessage.objects.filter(message_id=sent.id).exists()


def test_a_leased_message_is_flagged_and_its_extension_reports_it() -> None:
    sent = django_pgqueue.enqueue("t", {})
    message = lease_one(visibility_timeout=60)
    assert transitions.extend([message], 60).cancel_requested == []
    assert django_pgqueue.cancel(sent.id) == CancelResult.FLAGGED
    assert Message.objects.get(pk=sent.id).cancel_requested_at is not None
    outcome = transitions.extend([message], 60)
    assert outcome.done == [sent.id] and outcome.cancel_requested == [sent.id]
    # Cancelling again keeps the first request's time and says the same.
    first = Message.objects.get(pk=sent.id).cancel_requested_at
    assert django_pgqueue.cancel(sent.id) == CancelResult.FLAGGED
    assert Message.objects.get(pk=sent.id).cancel_requested_at == first


def test_a_flagged_message_that_fails_is_buried_as_cancelled_not_retried() -> None:
    sent = django_pgqueue.enqueue("t", {}, max_attempts=5)
    message = lease_one(visibility_timeout=60)
    django_pgqueue.cancel(sent.id)
    outcome = transitions.fail(
        [FailedAttempt(message, error_entry(RuntimeError("stop"), attempt=1), retry_in=0.0)]
    )
    assert outcome.buried == [sent.id] and outcome.retried == []
    assert DeadMessage.objects.get(message_id=sent.id).reason == "cancelled"


def test_a_flagged_message_that_finishes_is_archived() -> None:
    sent = django_pgqueue.enqueue("t", {})
    message = lease_one(visibility_timeout=60)
    django_pgqueue.cancel(sent.id)
    assert transitions.complete([message], ["done"]).done == [sent.id]
    assert ArchivedMessage.objects.get(message_id=sent.id).result == "done"


def test_a_message_whose_lease_expired_is_cancelled_at_once() -> None:
    sent = django_pgqueue.enqueue("t", {})
    message = lease_one(visibility_timeout=60)
    with connection.cursor() as cursor:  # the holder crashed: its lease ran out
        cursor.execute(
            "UPDATE pgqueue_message SET available_at = now() - interval '1 s' WHERE id = %s",
            [sent.id],
        )
    assert django_pgqueue.cancel(sent.id) == CancelResult.CANCELLED
    assert transitions.complete([message]).stale == [sent.id]  # its late ack is fenced off
    assert DeadMessage.objects.get(message_id=sent.id).reason == "cancelled"


def test_cancel_many_reports_each_id() -> None:
    ready = django_pgqueue.enqueue("t", {}).id
    held_id = django_pgqueue.enqueue("t", {}, priority=9).id
    assert lease_one(batch_size=1).id == held_id
    results = django_pgqueue.cancel_many([held_id, 424242, ready])
    assert results == {
        held_id: CancelResult.FLAGGED,
        424242: CancelResult.NOT_FOUND,
        ready: CancelResult.CANCELLED,
    }
