"""enqueue_chain(): steps one after the other, each reading the previous one's result."""

from __future__ import annotations

import pytest
from django.db import transaction

import django_pgqueue
from django_pgqueue import chain, enqueue_chain, step
from django_pgqueue.core import operations
from django_pgqueue.exceptions import DependencyError, InvalidMessage
from django_pgqueue.models import Message, WaitingMessage

from .helpers import bury, finish, where

pytestmark = pytest.mark.django_db(transaction=True)


def test_steps_run_in_order_and_each_reads_the_previous_result() -> None:
    written = enqueue_chain([step("a", {"n": 1}), step("b", {"n": 2}), step("c", {"n": 3})])
    a, b, c = written.ids
    assert [where(i) for i in (a, b, c)] == ["live", "waiting", "waiting"]
    finish(a, result={"from": "a"})
    assert [where(i) for i in (b, c)] == ["live", "waiting"]
    assert django_pgqueue.previous_result(b) == {"from": "a"}
    assert django_pgqueue.dependency_results(b) == {a: {"from": "a"}}
    finish(b, result=2)
    assert django_pgqueue.previous_result(c) == 2
    finish(c)
    assert written.last.id == c and where(c) == "finished"


def test_a_failed_step_buries_the_rest_and_its_retry_resumes_the_chain() -> None:
    a, b, c = enqueue_chain(chain(step("a"), step("b"), step("c"))).ids
    finish(a)
    bury(b)
    assert (where(b), where(c)) == ("dead", "dead")
    operations.retry_dead([b])
    assert (where(b), where(c)) == ("live", "waiting")
    finish(b)
    finish(c)
    assert where(c) == "finished"


def test_a_chain_can_wait_for_other_messages_and_be_waited_for() -> None:
    before = django_pgqueue.enqueue("x")
    written = enqueue_chain([step("a"), step("b")], after=[before])
    after = django_pgqueue.enqueue("y", after=[written.last])
    assert where(written.first.id) == "waiting"
    finish(before.id)
    finish(written.first.id)
    finish(written.last.id)
    assert where(after.id) == "live"


def test_a_chain_is_written_entirely_or_not_at_all() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_chain([step("a"), step("b")])
        raise RuntimeError
    assert Message.objects.count() == 0 and WaitingMessage.objects.count() == 0
    # A bad step anywhere: nothing written either.
    with pytest.raises(InvalidMessage):
        enqueue_chain([step("a"), step("b", queue="Bad Queue")])
    with pytest.raises(DependencyError):
        enqueue_chain([step("a"), step("b", dedup_key="k")])
    assert Message.objects.count() == 0 and WaitingMessage.objects.count() == 0


def test_steps_are_checked_when_named() -> None:
    with pytest.raises(TypeError, match="unknown option 'queu'"):
        step("a", queu="x")
    with pytest.raises(TypeError, match="sets after= itself"):
        step("a", after=[1])
    with pytest.raises(TypeError, match="neither a handler name"):
        step(42)
    with pytest.raises(ValueError, match="no steps"):
        chain()
