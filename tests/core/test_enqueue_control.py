"""Enqueue with ``unique_for`` and ``debounce`` against real PostgreSQL, concurrent
connections included (core/_enqueue_control.py)."""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import django_pgqueue
from django_pgqueue.core import transitions
from django_pgqueue.core._retention import run_retention
from django_pgqueue.exceptions import InvalidMessage
from django_pgqueue.models import ArchivedMessage, Message, MessageProgress, UniqueWindow
from tests.factories import MessageFactory, MessageProgressFactory

pytestmark = pytest.mark.django_db(transaction=True)


def in_threads(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(n)`` on ``count`` threads at once, each on its own connection."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            barrier.wait(10)
            results[n] = work(n)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return results


def expire_windows() -> None:
    UniqueWindow.objects.update(expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))


# -- unique_for -------------------------------------------------------------------------------


def test_unique_for_returns_the_first_message_while_it_waits_runs_and_after_it_finished() -> None:
    first = django_pgqueue.enqueue("tests.echo", {"n": 1}, dedup_key="k", unique_for=60)
    assert not first.deduplicated
    again = django_pgqueue.enqueue("tests.echo", {"n": 2}, dedup_key="k", unique_for=60)
    assert again.deduplicated and again.id == first.id
    assert again.enqueued_at == first.enqueued_at and again.task == "tests.echo"

    [leased] = Message.objects.lease("default", worker_id="w")
    transitions.complete([leased])
    assert ArchivedMessage.objects.filter(message_id=first.id).exists()
    after = django_pgqueue.enqueue("tests.echo", {"n": 3}, dedup_key="k", unique_for=60)
    assert after.deduplicated and after.id == first.id
    assert Message.objects.count() == 0


def test_unique_for_holds_after_the_first_message_died() -> None:
    first = django_pgqueue.enqueue("tests.echo", None, dedup_key="k", unique_for=dt.timedelta(1))
    [leased] = Message.objects.lease("default", worker_id="w")
    transitions.fail([transitions.FailedAttempt(leased, {"type": "E"}, retry_in=None)])
    again = django_pgqueue.enqueue("tests.echo", None, dedup_key="k", unique_for=60)
    assert again.deduplicated and again.id == first.id


def test_an_expired_window_is_taken_again_by_a_new_message() -> None:
    first = django_pgqueue.enqueue("tests.echo", None, dedup_key="k", unique_for=60)
    Message.objects.all().delete()
    expire_windows()
    second = django_pgqueue.enqueue("tests.echo", None, dedup_key="k", unique_for=60)
    assert not second.deduplicated and second.id != first.id
    window = UniqueWindow.objects.get()
    assert window.message_id == second.id


def test_windows_are_per_queue_and_key() -> None:
    a = django_pgqueue.enqueue("tests.echo", None, dedup_key="k", unique_for=60)
    b = django_pgqueue.enqueue("tests.echo", None, dedup_key="k", unique_for=60, queue="other")
    c = django_pgqueue.enqueue("tests.echo", None, dedup_key="k2", unique_for=60)
    assert len({a.id, b.id, c.id}) == 3


def test_a_window_found_live_by_its_dedup_key_holds_that_message() -> None:
    # A message enqueued with the key but without unique_for is live: the window records it.
    live = django_pgqueue.enqueue("tests.echo", None, dedup_key="k")
    found = django_pgqueue.enqueue("tests.echo", None, dedup_key="k", unique_for=60)
    assert found.deduplicated and found.id == live.id
    assert UniqueWindow.objects.get().message_id == live.id


def test_a_rolled_back_enqueue_does_not_hold_the_key() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        django_pgqueue.enqueue("tests.echo", None, dedup_key="k", unique_for=60)
        raise RuntimeError("roll back")
    assert not UniqueWindow.objects.exists()
    written = django_pgqueue.enqueue("tests.echo", None, dedup_key="k", unique_for=60)
    assert not written.deduplicated


def test_enqueue_on_commit_takes_the_window_after_the_commit() -> None:
    with transaction.atomic():
        django_pgqueue.enqueue_on_commit("tests.echo", None, dedup_key="k", unique_for=60)
        assert not UniqueWindow.objects.exists()
    assert UniqueWindow.objects.get().message_id == Message.objects.get().id


def test_concurrent_enqueues_of_one_key_write_one_message() -> None:
    def enqueue(n: int) -> django_pgqueue.EnqueuedMessage:
        with transaction.atomic():
            return django_pgqueue.enqueue("tests.echo", {"n": n}, dedup_key="k", unique_for=60)

    results = in_threads(8, enqueue)
    assert Message.objects.count() == 1
    assert len({r.id for r in results}) == 1
    assert sum(not r.deduplicated for r in results) == 1


def test_an_enqueue_waits_for_the_transaction_holding_the_window() -> None:
    # The first transaction took the window and has not committed: the second waits for it
    # and then returns its message, not a second one.
    taken, release = threading.Event(), threading.Event()
    first: list[Any] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                first.append(django_pgqueue.enqueue("tests.echo", 1, dedup_key="k", unique_for=60))
                taken.set()
                release.wait(10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    assert taken.wait(10)
    threading.Timer(0.3, release.set).start()
    second = django_pgqueue.enqueue("tests.echo", 2, dedup_key="k", unique_for=60)
    holder.join(10)
    assert second.deduplicated and second.id == first[0].id


def test_unique_for_is_checked_before_anything_is_written() -> None:
    with pytest.raises(InvalidMessage, match="needs a dedup_key"):
        django_pgqueue.enqueue("tests.echo", None, unique_for=60)
    with pytest.raises(InvalidMessage, match="exclude each other"):
        django_pgqueue.enqueue("tests.echo", None, dedup_key="k", unique_for=60, debounce=1)
    for bad in (0, -1, float("nan"), True, "60", dt.timedelta(days=400)):
        with pytest.raises(InvalidMessage, match="unique_for"):
            django_pgqueue.enqueue("tests.echo", None, dedup_key="k", unique_for=bad)  # type: ignore[arg-type]
    assert not Message.objects.exists() and not UniqueWindow.objects.exists()


@override_settings(DEBUG=True)
def test_a_plain_enqueue_sends_one_statement() -> None:
    with CaptureQueriesContext(connection) as plain:
        django_pgqueue.enqueue("tests.echo", None)
    with CaptureQueriesContext(connection) as keyed:
        django_pgqueue.enqueue("tests.echo", None, dedup_key="k")
    assert len(plain.captured_queries) == 1
    assert len(keyed.captured_queries) == 1
    assert "unique_window" not in keyed.captured_queries[0]["sql"]


# -- debounce ---------------------------------------------------------------------------------


def test_debounce_replaces_the_payload_and_pushes_back_the_start() -> None:
    first = django_pgqueue.enqueue("tests.echo", {"v": 1}, dedup_key="d", debounce=30)
    again = django_pgqueue.enqueue("tests.echo", {"v": 2}, dedup_key="d", debounce=60)
    assert not first.deduplicated
    assert again.deduplicated and again.id == first.id
    assert again.available_at - first.available_at > dt.timedelta(seconds=29)
    row = Message.objects.get()
    assert row.payload == {"v": 2} and row.available_at == again.available_at
    assert row.debounce_key == "d" and row.dedup_key is None


def test_debounce_writes_a_new_message_once_the_first_started() -> None:
    first = django_pgqueue.enqueue("tests.echo", {"v": 1}, dedup_key="d", debounce=0.01)
    Message.objects.filter(id=first.id).update(available_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    [leased] = Message.objects.lease("default", worker_id="w")
    second = django_pgqueue.enqueue("tests.echo", {"v": 2}, dedup_key="d", debounce=30)
    assert not second.deduplicated and second.id != first.id
    # The running one keeps its payload; the next debounce goes to the waiting one.
    third = django_pgqueue.enqueue("tests.echo", {"v": 3}, dedup_key="d", debounce=30)
    assert third.deduplicated and third.id == second.id
    assert Message.objects.get(id=first.id).payload == {"v": 1}
    assert Message.objects.get(id=second.id).payload == {"v": 3}
    # Once the first finished, the waiting one is still the key's.
    transitions.complete([leased])
    fourth = django_pgqueue.enqueue("tests.echo", {"v": 4}, dedup_key="d", debounce=30)
    assert fourth.id == second.id


def test_debounce_does_not_touch_a_message_that_failed_and_waits_to_retry() -> None:
    first = django_pgqueue.enqueue("tests.echo", {"v": 1}, dedup_key="d", debounce=0.01)
    Message.objects.filter(id=first.id).update(available_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    [leased] = Message.objects.lease("default", worker_id="w")
    transitions.fail([transitions.FailedAttempt(leased, {"type": "E"}, retry_in=60)])
    second = django_pgqueue.enqueue("tests.echo", {"v": 2}, dedup_key="d", debounce=30)
    assert second.id != first.id
    assert Message.objects.get(id=first.id).payload == {"v": 1}


def test_debounce_keys_are_per_queue_and_task() -> None:
    a = django_pgqueue.enqueue("tests.echo", 1, dedup_key="d", debounce=30)
    b = django_pgqueue.enqueue("tests.effect", 1, dedup_key="d", debounce=30)
    c = django_pgqueue.enqueue("tests.echo", 1, dedup_key="d", debounce=30, queue="other")
    assert len({a.id, b.id, c.id}) == 3


def test_concurrent_debounces_of_one_key_leave_one_message() -> None:
    def enqueue(n: int) -> django_pgqueue.EnqueuedMessage:
        with transaction.atomic():
            return django_pgqueue.enqueue("tests.echo", {"n": n}, dedup_key="d", debounce=30)

    results = in_threads(8, enqueue)
    assert Message.objects.count() == 1
    assert len({r.id for r in results}) == 1
    assert sum(not r.deduplicated for r in results) == 1
    # The last to commit wrote its payload.
    assert Message.objects.get().payload in [{"n": n} for n in range(8)]


def test_a_debounce_racing_a_claim_writes_a_new_message_and_leaves_the_lease_alone() -> None:
    # A worker's claim holds the row (not committed yet) when the debounce arrives: the
    # debounce waits, sees the message leased, and writes a new one; the claimed message
    # keeps the payload its worker read.
    first = django_pgqueue.enqueue("tests.echo", {"v": 1}, dedup_key="d", debounce=0.01)
    Message.objects.filter(id=first.id).update(available_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    claimed, release = threading.Event(), threading.Event()
    leased: list[Message] = []

    def claim() -> None:
        try:
            with transaction.atomic():
                leased.extend(Message.objects.lease("default", worker_id="w", hold=True))
                claimed.set()
                release.wait(10)
        finally:
            connections.close_all()

    worker = threading.Thread(target=claim)
    worker.start()
    assert claimed.wait(10)
    threading.Timer(0.3, release.set).start()
    second = django_pgqueue.enqueue("tests.echo", {"v": 2}, dedup_key="d", debounce=30)
    worker.join(10)
    assert [m.id for m in leased] == [first.id] and leased[0].payload == {"v": 1}
    assert not second.deduplicated and second.id != first.id
    assert Message.objects.get(id=first.id).payload == {"v": 1}
    assert transitions.complete(leased).done == [first.id]


def test_a_claim_after_a_debounce_finds_the_message_not_due() -> None:
    first = django_pgqueue.enqueue("tests.echo", {"v": 1}, dedup_key="d", debounce=0.01)
    Message.objects.filter(id=first.id).update(available_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    django_pgqueue.enqueue("tests.echo", {"v": 2}, dedup_key="d", debounce=30)
    assert Message.objects.lease("default", worker_id="w") == []


@override_settings(PGQUEUE={"QUEUES": {"fair": {"FAIRNESS": True}}})
def test_debounce_in_a_fair_queue_leaves_the_fair_order_until_due() -> None:
    first = django_pgqueue.enqueue(
        "tests.echo", {"v": 1}, queue="fair", tenant="t", dedup_key="d", debounce=30
    )
    assert Message.objects.get().fair_order == -1
    # Due, with a place in the fair order (as a claim gives it), then pushed back again.
    Message.objects.filter(id=first.id).update(
        available_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC), fair_order=5
    )
    again = django_pgqueue.enqueue(
        "tests.echo", {"v": 2}, queue="fair", tenant="t", dedup_key="d", debounce=0.01
    )
    assert again.id == first.id
    assert Message.objects.get().fair_order == -1
    Message.objects.filter(id=first.id).update(available_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    [leased] = Message.objects.lease("fair", worker_id="w")
    assert leased.id == first.id and leased.payload == {"v": 2}


def test_debounce_is_checked_before_anything_is_written() -> None:
    with pytest.raises(InvalidMessage, match="needs a dedup_key"):
        django_pgqueue.enqueue("tests.echo", None, debounce=1)
    with pytest.raises(InvalidMessage, match="run_after"):
        django_pgqueue.enqueue(
            "tests.echo", None, dedup_key="d", debounce=1, run_after=dt.timedelta(1)
        )
    with pytest.raises(InvalidMessage, match="debounce"):
        django_pgqueue.enqueue("tests.echo", None, dedup_key="d", debounce=0)
    assert not Message.objects.exists()


# -- housekeeping -----------------------------------------------------------------------------


def test_retention_deletes_expired_windows_and_orphaned_progress() -> None:
    django_pgqueue.enqueue("tests.echo", None, dedup_key="old", unique_for=60)
    expire_windows()
    django_pgqueue.enqueue("tests.echo", None, dedup_key="new", unique_for=60)
    live = MessageFactory()
    MessageProgressFactory(message_id=live.id)
    MessageProgressFactory(message_id=live.id + 1000)

    dry = run_retention(dry_run=True)
    assert {(s.source, s.rows) for s in dry.steps} >= {("unique windows", 1), ("progress", 1)}
    assert UniqueWindow.objects.count() == 2

    report = run_retention()
    assert {(s.source, s.rows) for s in report.steps} >= {("unique windows", 1), ("progress", 1)}
    assert list(UniqueWindow.objects.values_list("key", flat=True)) == ["new"]
    assert list(MessageProgress.objects.values_list("message_id", flat=True)) == [live.id]


# -- the how-to's examples --------------------------------------------------------------------

HOWTO = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "job-control.md"


def documented_example(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", HOWTO.read_text(), re.DOTALL)
    (example,) = [block for block in blocks if marker in block]
    return example


def test_the_documented_unique_window_example_runs() -> None:
    namespace: dict[str, Any] = {}
    exec(documented_example("unique_for="), namespace)
    assert Message.objects.count() == 1 and namespace["again"].deduplicated


def test_the_documented_debounce_example_runs() -> None:
    namespace: dict[str, Any] = {}
    exec(documented_example("debounce="), namespace)
    [message] = Message.objects.all()
    assert message.payload == {"document": 7, "title": "Final"}
    assert namespace["queued"].id == message.id and namespace["queued"].deduplicated
