"""enqueue_batch(): members counted as they finish; callbacks decided once."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_pgqueue import batch_of, batch_results, chain, enqueue_batch, step
from django_pgqueue.core import operations
from django_pgqueue.exceptions import InvalidMessage
from django_pgqueue.models import Batch, Message, WaitingMessage

from .helpers import bury, finish, where

pytestmark = pytest.mark.django_db(transaction=True)


def counts(batch_id: int) -> tuple[int, int, int]:
    batch = Batch.objects.get(id=batch_id)
    return batch.total, batch.succeeded, batch.failed


def test_all_succeed_then_complete_and_success_run_and_failure_never() -> None:
    batch = enqueue_batch(
        [step("m", {"i": i}) for i in range(3)],
        on_complete=step("done"),
        on_success=step("ok"),
        on_failure=step("ko"),
        label="three",
    )
    assert batch.on_complete and batch.on_success and batch.on_failure
    assert where(batch.on_complete.id) == "waiting"
    first, second, third = batch.member_ids
    finish(first, second, result="r")
    assert counts(batch.id) == (3, 2, 0)
    assert where(batch.on_complete.id) == "waiting"
    finish(third, result="r3")
    assert counts(batch.id) == (3, 3, 0)
    assert where(batch.on_complete.id) == "live" and where(batch.on_success.id) == "live"
    assert where(batch.on_failure.id) == "nowhere"
    done = Batch.objects.get(id=batch.id)
    assert done.completed_at is not None and done.succeeded_at is not None
    # A callback finds its batch, and the members' results.
    assert batch_of(batch.on_complete.id).id == batch.id  # type: ignore[union-attr]
    assert batch_of(first).id == batch.id  # type: ignore[union-attr]
    assert batch_results(batch.id) == {first: "r", second: "r", third: "r3"}


def test_a_failure_runs_complete_and_failure_and_success_after_the_retry() -> None:
    batch = enqueue_batch(
        [step("m"), step("m")],
        on_complete=step("done"),
        on_success=step("ok"),
        on_failure=step("ko"),
    )
    assert batch.on_complete and batch.on_success and batch.on_failure
    good, bad = batch.member_ids
    finish(good)
    bury(bad)
    assert counts(batch.id) == (2, 1, 1)
    assert where(batch.on_complete.id) == "live" and where(batch.on_failure.id) == "live"
    assert where(batch.on_success.id) == "dead"
    finish(batch.on_complete.id, batch.on_failure.id)

    operations.retry_dead([bad])
    assert counts(batch.id) == (2, 1, 0)
    finish(bad)
    assert counts(batch.id) == (2, 2, 0)
    # Success runs now; completion and failure ran once and do not run again.
    assert where(batch.on_success.id) == "live"
    assert where(batch.on_complete.id) == "finished"
    assert Message.objects.filter(task__in=["done", "ko"]).count() == 0


def test_a_chain_as_a_member_counts_by_its_last_step() -> None:
    batch = enqueue_batch([chain(step("a"), step("b")), step("c")], on_success=step("ok"))
    assert batch.on_success
    b, c = batch.member_ids
    assert where(b) == "waiting"
    finish(c)
    assert where(batch.on_success.id) == "waiting"
    [a] = [m.id for m in Message.objects.filter(task="a")]
    finish(a)
    finish(b)
    assert where(batch.on_success.id) == "live"


def test_an_empty_batch_is_complete_at_once() -> None:
    batch = enqueue_batch([], on_complete=step("done"), on_success=step("ok"))
    assert batch.on_complete and batch.on_success
    assert where(batch.on_complete.id) == "live" and where(batch.on_success.id) == "live"


def test_a_batch_is_written_entirely_or_not_at_all() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_batch([step("m")], on_complete=step("done"))
        raise RuntimeError
    with pytest.raises(InvalidMessage):
        enqueue_batch([step("m"), step("m", priority=1000)], on_complete=step("done"))
    with pytest.raises(InvalidMessage, match="dedup_key"):
        enqueue_batch([step("m", dedup_key="k")])
    assert Message.objects.count() == WaitingMessage.objects.count() == Batch.objects.count() == 0
