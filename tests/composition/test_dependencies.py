"""enqueue(after=...): a message waits, out of the claim's sight, until its dependencies have
finished; a dead dependency buries it; retrying that one brings it back."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection, transaction

import django_pgqueue
from django_pgqueue.core import operations, transitions
from django_pgqueue.exceptions import DependencyError
from django_pgqueue.models import DeadMessage, Dependency, Message, WaitingMessage

from .helpers import bury, finish, lease_all, where

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_dependent_waits_unclaimable_until_its_last_dependency_finishes() -> None:
    first = django_pgqueue.enqueue("t", {"n": 1})
    second = django_pgqueue.enqueue("t", {"n": 2}, queue="other")
    after = django_pgqueue.enqueue("t", {"n": 3}, after=[first, second.id])
    assert after.available_at is None and where(after.id) == "waiting"
    assert WaitingMessage.objects.get(id=after.id).pending == 2

    finish(first.id)
    assert where(after.id) == "waiting"
    assert WaitingMessage.objects.get(id=after.id).pending == 1
    assert [m.id for m in lease_all()] == []  # it is not claimable meanwhile

    finish(second.id, queue="other")
    # Released by the statement that archived its last dependency, with its own id.
    assert where(after.id) == "live"
    [claimed] = lease_all()
    assert claimed.id == after.id and claimed.payload == {"n": 3}
    transitions.complete([claimed])
    assert where(after.id) == "finished"
    assert not Dependency.objects.filter(dependent_id=after.id).exists()


def test_a_dependency_that_finished_already_counts_as_done() -> None:
    first = django_pgqueue.enqueue("t", {})
    finish(first.id)
    after = django_pgqueue.enqueue("t", {}, after=[first])
    assert where(after.id) == "live" and after.available_at is not None


def test_a_dependent_delay_counts_from_its_release() -> None:
    first = django_pgqueue.enqueue("t", {})
    after = django_pgqueue.enqueue("t", {}, after=[first], run_after=dt.timedelta(hours=1))
    finish(first.id)
    released = Message.objects.get(id=after.id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (now,) = cursor.fetchone()
    assert released.available_at > now + dt.timedelta(minutes=59)


def test_a_dead_dependency_buries_the_whole_descent_and_a_retry_brings_it_back() -> None:
    root = django_pgqueue.enqueue("t", {})
    child = django_pgqueue.enqueue("t", {}, after=[root])
    grandchild = django_pgqueue.enqueue("t", {}, after=[child])
    bury(root.id)
    for message_id in (child.id, grandchild.id):
        dead = DeadMessage.objects.get(message_id=message_id)
        assert dead.reason == "dependency_failed"
        assert dead.details["dependency"] == root.id
        assert f"message {root.id}" in dead.details["message"]

    operations.retry_dead([root.id])
    assert where(root.id) == "live"
    assert (where(child.id), where(grandchild.id)) == ("waiting", "waiting")
    finish(root.id)
    finish(child.id)
    finish(grandchild.id)
    assert where(grandchild.id) == "finished"


def test_a_dependent_of_a_dead_message_is_buried_at_once_and_comes_back_with_it() -> None:
    root = django_pgqueue.enqueue("t", {})
    bury(root.id)
    late = django_pgqueue.enqueue("t", {}, after=[root])
    assert where(late.id) == "dead"
    operations.retry_dead([root.id])
    assert where(late.id) == "waiting"


def test_bad_dependencies_are_refused_and_nothing_is_written() -> None:
    for bad in ([], ["x"], [0], [-3], "12", [True]):
        with pytest.raises(DependencyError):
            django_pgqueue.enqueue("t", {}, after=bad)
    with pytest.raises(DependencyError, match="no message has the id 987654321"):
        django_pgqueue.enqueue("t", {}, after=[987654321])
    first = django_pgqueue.enqueue("t", {})
    with pytest.raises(DependencyError, match="dedup_key"):
        django_pgqueue.enqueue("t", {}, after=[first], dedup_key="k")
    assert WaitingMessage.objects.count() == 0 and Dependency.objects.count() == 0


def test_a_rolled_back_dependent_leaves_nothing() -> None:
    first = django_pgqueue.enqueue("t", {})
    with pytest.raises(RuntimeError), transaction.atomic():
        django_pgqueue.enqueue("t", {}, after=[first])
        raise RuntimeError
    assert WaitingMessage.objects.count() == 0 and Dependency.objects.count() == 0
    finish(first.id)  # and finishing its dependency finds nothing to release


def test_cancelling_a_waiting_message_buries_it_and_its_dependents() -> None:
    first = django_pgqueue.enqueue("t", {})
    middle = django_pgqueue.enqueue("t", {}, after=[first])
    last = django_pgqueue.enqueue("t", {}, after=[middle])
    assert django_pgqueue.cancel(middle.id) == "cancelled"
    assert DeadMessage.objects.get(message_id=middle.id).reason == "cancelled"
    assert DeadMessage.objects.get(message_id=last.id).reason == "dependency_failed"
    finish(first.id)
    assert where(middle.id) == "dead"


def test_purging_a_queue_buries_what_waits_on_it_elsewhere() -> None:
    first = django_pgqueue.enqueue("t", {}, queue="doomed")
    same_queue = django_pgqueue.enqueue("t", {}, queue="doomed", after=[first])
    elsewhere = django_pgqueue.enqueue("t", {}, after=[first])
    assert operations.purge_queue("doomed") == 2
    assert where(same_queue.id) == "nowhere" and where(first.id) == "nowhere"
    assert DeadMessage.objects.get(message_id=elsewhere.id).reason == "dependency_failed"


def test_retrying_a_buried_dependent_itself_makes_it_wait_never_run_without_it() -> None:
    root = django_pgqueue.enqueue("t", {})
    child = django_pgqueue.enqueue("t", {}, after=[root])
    bury(root.id)
    assert operations.retry_dead([child.id]).done == [child.id]
    assert where(child.id) == "waiting"
    assert WaitingMessage.objects.get(id=child.id).pending == 1
    operations.retry_dead([root.id])
    finish(root.id)
    assert where(child.id) == "live"
