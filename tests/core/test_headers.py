"""Message headers: checked at enqueue, stored beside the payload, carried by every move."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection, transaction

import django_pgqueue
from django_pgqueue.core import operations, transitions
from django_pgqueue.core._headers import (
    HEADER_VALUE_MAX_LENGTH,
    HEADERS_MAX_KEYS,
    validate_headers,
)
from django_pgqueue.exceptions import InvalidMessage
from django_pgqueue.models import DeadMessage, Message

pytestmark = pytest.mark.django_db(transaction=True)

HEADERS = {"request-id": "r-1", "tenant.region": "eu_west"}


def stored(message_id: int, table: str = "pgqueue_message", column: str = "id") -> Any:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT headers FROM {table} WHERE {column} = %s", [message_id])
        value = cursor.fetchone()[0]
    return None if value is None else json.loads(value)  # Django's cursor reads jsonb as text


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ("x", "must be a dict"),
        ({1: "a"}, "must be a str"),
        ({"": "a"}, "1 to 64 characters"),
        ({"a b": "a"}, "1 to 64 characters"),
        ({"k" * 65: "a"}, "1 to 64 characters"),
        ({"k": 1}, "must have a str value"),
        ({"k": "v" * (HEADER_VALUE_MAX_LENGTH + 1)}, "over the 1024 allowed"),
        ({"k": "a\nb"}, "control character U\\+000A"),
        ({"k": "a\x00"}, "control character U\\+0000"),
        ({"k": "\ud800"}, "lone surrogate"),
        ({f"k{n}": "v" for n in range(HEADERS_MAX_KEYS + 1)}, "33 keys"),
        ({f"k{n}": "v" * 1000 for n in range(9)}, "bytes of JSON, over the 8192"),
    ],
)
def test_bad_headers_are_refused_precisely_and_nothing_is_written(headers: Any, says: str) -> None:
    with pytest.raises(InvalidMessage, match=says):
        django_pgqueue.enqueue("tests.echo", {}, headers=headers)
    with pytest.raises(InvalidMessage, match=says):
        django_pgqueue.enqueue_many("tests.echo", [{}], headers=headers)
    assert not Message.objects.exists()


def test_no_headers_store_null() -> None:
    assert validate_headers({}) is None
    plain = django_pgqueue.enqueue("tests.echo", {})
    empty = django_pgqueue.enqueue("tests.echo", {}, headers={})
    assert stored(plain.id) is None and stored(empty.id) is None
    assert Message.objects.get(id=plain.id).headers is None


def test_every_enqueue_path_stores_the_headers() -> None:
    one = django_pgqueue.enqueue("tests.echo", {}, headers=HEADERS)
    fair = django_pgqueue.enqueue("tests.echo", {}, headers=HEADERS, dedup_key="k")
    with transaction.atomic():
        django_pgqueue.enqueue_on_commit("tests.echo", {"later": 1}, headers=HEADERS)
    django_pgqueue.enqueue_many("tests.echo", [{"m": 1}, {"m": 2}], headers=HEADERS)
    django_pgqueue.enqueue_many(
        "tests.echo", [{"d": 1}, {"d": 2}], dedup_keys=["a", "b"], headers=HEADERS
    )
    django_pgqueue.enqueue("tests.echo", {}, headers=HEADERS, dedup_key="db", debounce=60)
    rows = list(Message.objects.values_list("headers", flat=True))
    assert len(rows) == 8 and all(row == HEADERS for row in rows)
    assert stored(one.id) == HEADERS and stored(fair.id) == HEADERS


def test_enqueue_many_into_a_fair_queue_copies_the_headers(settings: Any) -> None:
    settings.PGQUEUE = {"QUEUES": {"fairq": {"FAIRNESS": True}}}
    django_pgqueue.enqueue_many("tests.echo", [1, 2, 3], queue="fairq", headers=HEADERS)
    assert list(Message.objects.values_list("headers", flat=True)) == [HEADERS] * 3


def test_headers_follow_the_message_to_dead_and_back_and_to_the_archive() -> None:
    sent = django_pgqueue.enqueue("tests.echo", {}, headers=HEADERS, max_attempts=1)
    [leased] = Message.objects.lease("default", worker_id="w", batch_size=1)
    assert leased.headers == HEADERS
    transitions.fail([transitions.FailedAttempt(lease=leased, error={"type": "X"}, retry_in=0)])
    assert DeadMessage.objects.get(message_id=sent.id).headers == HEADERS
    operations.retry_dead([sent.id])
    assert stored(sent.id) == HEADERS
    [leased] = Message.objects.lease("default", worker_id="w", batch_size=1)
    transitions.complete([leased])
    assert stored(sent.id, "pgqueue_archive", "message_id") == HEADERS


def test_a_waiting_message_keeps_its_headers_through_release_and_cancel() -> None:
    first = django_pgqueue.enqueue("tests.echo", {})
    waiting = django_pgqueue.enqueue("tests.echo", {}, after=[first], headers=HEADERS)
    cancelled = django_pgqueue.enqueue("tests.echo", {}, after=[first], headers=HEADERS)
    assert stored(waiting.id, "pgqueue_waiting") == HEADERS
    django_pgqueue.cancel(cancelled.id)
    assert DeadMessage.objects.get(message_id=cancelled.id).headers == HEADERS
    [leased] = Message.objects.lease("default", worker_id="w", batch_size=1)
    transitions.complete([leased])
    assert stored(waiting.id) == HEADERS


def test_no_index_reads_the_headers() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE indexdef LIKE '%%headers%%'"
            " AND tablename LIKE 'pgqueue_%%'"
        )
        assert cursor.fetchall() == []
