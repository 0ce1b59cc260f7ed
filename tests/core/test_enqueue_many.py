"""enqueue_many(): COPY with and without dedup keys, plain and fair queues, a key taken by a
concurrent enqueue while the call runs, and bad rows named by their position."""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.test import override_settings

import django_pgqueue
from django_pgqueue.core import _enqueue
from django_pgqueue.exceptions import InvalidMessage, PayloadError
from django_pgqueue.models import Message
from tests.conftest import connection_kwargs, drain

pytestmark = pytest.mark.django_db(transaction=True)

FAIR = {"QUEUES": {"fair": {"FAIRNESS": True}}}


def rows(queue: str = "default") -> list[tuple[Any, ...]]:
    return list(
        Message.objects.filter(queue=queue)
        .order_by("id")
        .values_list("payload", "dedup_key", "fair_order")
    )


@pytest.mark.parametrize("queue", ["default", "fair"])
@override_settings(PGQUEUE=FAIR)
def test_keys_held_by_live_messages_and_repeated_keys_are_skipped(queue: str, listener) -> None:
    django_pgqueue.enqueue("t", {"n": "held"}, queue=queue, dedup_key="k1")
    written = django_pgqueue.enqueue_many(
        "t",
        [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}],
        queue=queue,
        dedup_keys=["k1", "k2", None, "k2", None],
    )
    assert written == 3  # k1 is held, the second k2 repeats the first
    found = rows(queue)
    assert [(payload, key) for payload, key, _ in found] == [
        ({"n": "held"}, "k1"),
        ({"n": 1}, "k2"),
        ({"n": 2}, None),
        ({"n": 4}, None),
    ]
    if queue == "fair":  # the rows written take consecutive places in the fair order
        places = [place for _, _, place in found[1:]]
        assert places == sorted(places) and len(set(places)) == 3
    else:
        assert {place for _, _, place in found} == {None}
    assert ("django_pgqueue", queue) in drain(listener)


@override_settings(PGQUEUE=FAIR)
def test_a_fair_bulk_without_keys_takes_consecutive_places() -> None:
    assert django_pgqueue.enqueue_many("t", [{"n": n} for n in range(5000)], queue="fair") == 5000
    places = [place for _, _, place in rows("fair")]
    assert places == sorted(places) and len(set(places)) == 5000 and places[0] >= 0


@pytest.mark.parametrize("in_transaction", [False, True])
@pytest.mark.parametrize("queue", ["default", "fair"])
@override_settings(PGQUEUE=FAIR)
def test_a_key_taken_by_a_concurrent_enqueue_is_skipped(
    queue: str, in_transaction: bool, monkeypatch: pytest.MonkeyPatch, listener
) -> None:
    # "x" is held: the first COPY fails and the held keys are looked up. Another session
    # takes key "b" and commits after that look, before the second COPY: it meets the
    # unique index too; the rows go in by INSERT ... ON CONFLICT, which skips both.
    django_pgqueue.enqueue("held", {}, queue=queue, dedup_key="x")
    _take_key_after_the_look(monkeypatch, queue, "b")
    drain(listener)
    with transaction.atomic() if in_transaction else contextlib.nullcontext():
        # In the caller's transaction, a savepoint; that transaction carries on.
        written = django_pgqueue.enqueue_many(
            "t",
            [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}],
            queue=queue,
            dedup_keys=["x", "a", "b", None],
        )
        if in_transaction:
            django_pgqueue.enqueue("t", {"n": "after"}, queue="other")
    assert written == 2
    assert ("django_pgqueue", queue) in drain(listener)
    found = Message.objects.filter(queue=queue).order_by("id")
    assert [(m.task, m.dedup_key) for m in found] == [
        ("held", "x"),
        ("raced", "b"),
        ("t", "a"),
        ("t", None),
    ]
    assert found[2].payload == {"n": 1} and found[3].payload == {"n": 3}
    if queue == "fair":
        assert found[2].fair_order is not None and found[2].fair_order < found[3].fair_order
    assert Message.objects.filter(queue="other").count() == (1 if in_transaction else 0)


@pytest.mark.parametrize("queue", ["default", "fair"])
@override_settings(PGQUEUE=FAIR)
def test_a_call_that_writes_nothing_sends_no_wake_up(
    queue: str, monkeypatch: pytest.MonkeyPatch, listener
) -> None:
    django_pgqueue.enqueue_many("t", [{}, {}], queue=queue, dedup_keys=["a", "b"])
    drain(listener)
    # Every key held: found by the look after the first COPY failed.
    assert django_pgqueue.enqueue_many("t", [{}, {}], queue=queue, dedup_keys=["b", "a"]) == 0
    assert drain(listener) == []
    # The last new key taken after that look: the INSERT ... ON CONFLICT writes nothing,
    # and in a fair queue its places statement sends no wake-up before it.
    _take_key_after_the_look(monkeypatch, queue, "c")
    assert django_pgqueue.enqueue_many("t", [{}, {}], queue=queue, dedup_keys=["a", "c"]) == 0
    assert Message.objects.filter(queue=queue).count() == 3
    assert drain(listener) == []


def _take_key_after_the_look(monkeypatch: pytest.MonkeyPatch, queue: str, key: str) -> None:
    """Another session takes ``key`` right after enqueue_many() looked up the held keys."""
    looked = _enqueue._held_left_out

    def look_then_race(*args: Any) -> Any:
        found = looked(*args)
        _take_key(queue, key)
        return found

    monkeypatch.setattr(_enqueue, "_held_left_out", look_then_race)


def _take_key(queue: str, key: str) -> None:
    """A live message of ``queue`` with ``key``, written and committed by another session."""
    with psycopg.connect(**connection_kwargs(), autocommit=True) as other:
        other.execute(
            "INSERT INTO pgqueue_message (queue, task, payload, dedup_key) "
            "VALUES (%s, 'raced', '{}', %s)",
            [queue, key],
        )


def test_a_bad_payload_or_key_is_named_by_its_position_and_nothing_is_written() -> None:
    with pytest.raises(PayloadError, match=r"^payload 2: "):
        django_pgqueue.enqueue_many("t", [{}, {}, {"bad": {1, 2}}, {}])
    with pytest.raises(PayloadError, match=r"^payload 1: .*NaN|^payload 1: "):
        django_pgqueue.enqueue_many("t", [{}, float("nan")])
    with pytest.raises(InvalidMessage, match=r"^dedup key 1: "):
        django_pgqueue.enqueue_many("t", [{}, {}], dedup_keys=["a", ""])
    with pytest.raises(ValueError, match="one dedup key per payload"):
        django_pgqueue.enqueue_many("t", [{}, {}], dedup_keys=["a"])
    assert Message.objects.count() == 0


@pytest.mark.parametrize(
    ("run_after", "after_enqueue"),
    [(None, dt.timedelta(0)), (dt.timedelta(seconds=30), dt.timedelta(seconds=30))],
)
def test_rows_become_available_by_database_time(
    run_after: dt.timedelta | None, after_enqueue: dt.timedelta
) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        before = cursor.fetchone()[0]
    django_pgqueue.enqueue_many("t", [{}, {}], dedup_keys=["a", None], run_after=run_after)
    for available_at in Message.objects.values_list("available_at", flat=True):
        assert after_enqueue <= available_at - before < after_enqueue + dt.timedelta(seconds=5)


@pytest.mark.parametrize("keyed", [False, True])
def test_awkward_keys_and_payloads_are_copied_exactly(keyed: bool) -> None:
    # With keys each row has columns of its own after the payload; without, they are shared.
    keys = ["tab\tkey", "new\nline", "back\\slash", "\\N", "cr\rkey", "é ✓"]
    payloads = [{"text": key, "raw": "\\N \\t \\\\"} for key in keys]
    written = django_pgqueue.enqueue_many("t", payloads, dedup_keys=keys if keyed else None)
    assert written == len(keys)
    assert [(payload, key) for payload, key, _ in rows()] == [
        (payload, key if keyed else None) for payload, key in zip(payloads, keys, strict=True)
    ]


def test_enum_priority_tenant_and_keys_are_written_as_their_values() -> None:
    class Urgency(enum.IntEnum):
        HIGH = 5

    class Key(str, enum.Enum):  # noqa: UP042 -- unlike a StrEnum, its str() is not its value
        FIRST = "first"

    written = django_pgqueue.enqueue_many(
        "t", [{}], priority=Urgency.HIGH, tenant=Key.FIRST, dedup_keys=[Key.FIRST]
    )
    assert written == 1
    assert list(Message.objects.values_list("priority", "tenant", "dedup_key")) == [
        (5, "first", "first")
    ]
    # The key held is the value: a second enqueue with it, or with the plain text, is skipped.
    assert django_pgqueue.enqueue_many("t", [{}], dedup_keys=["first"]) == 0


def test_an_empty_call_writes_nothing() -> None:
    assert django_pgqueue.enqueue_many("t", []) == 0
    assert not Message.objects.exists()
