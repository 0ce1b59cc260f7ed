"""Input PostgreSQL cannot store, or a time it cannot give back, is refused before any write.

U+0000 (text and jsonb refuse it; libpq would cut a parameter there) and lone surrogates
(not UTF-8) in any text field or payload, and a ``run_after`` outside the documented range,
raise ``InvalidMessage`` naming the field on every enqueue path, in autocommit and inside the
caller's transaction, which stays usable.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

import django_pgqueue
from django_pgqueue.core._validation import RUN_AFTER_EARLIEST, RUN_AFTER_LATEST
from django_pgqueue.exceptions import InvalidMessage
from django_pgqueue.models import Message

pytestmark = pytest.mark.django_db(transaction=True)

UTC = dt.UTC
GOOD: dict[str, Any] = {"task": "t", "payload": {"n": 1}, "tenant": "acme", "dedup_key": "k"}


def one(**fields: Any) -> None:
    django_pgqueue.enqueue(**fields)


def on_commit(**fields: Any) -> None:
    django_pgqueue.enqueue_on_commit(**fields)


def many(**fields: Any) -> None:
    key = fields.pop("dedup_key")
    django_pgqueue.enqueue_many(
        fields.pop("task"), [{"n": 0}, fields.pop("payload")], dedup_keys=["k0", key], **fields
    )


PATHS: dict[str, Callable[..., None]] = {
    "enqueue": one,
    "enqueue_on_commit": on_commit,
    "enqueue_many": many,
}


def transaction_is_usable() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone() == (1,)


def refused(path: str, atomic: bool, match: str, **changes: Any) -> None:
    """``path`` with ``changes`` raises InvalidMessage matching ``match`` and writes nothing."""
    fields = {**GOOD, **changes}
    if atomic:
        with transaction.atomic():
            with pytest.raises(InvalidMessage, match=match):
                PATHS[path](**fields)
            assert transaction_is_usable()
            django_pgqueue.enqueue("after", {})  # the caller's transaction goes on
        assert list(Message.objects.values_list("task", flat=True)) == ["after"]
    else:
        with pytest.raises(InvalidMessage, match=match):
            PATHS[path](**fields)
        assert Message.objects.count() == 0


TEXT_FIELDS = ["task", "tenant", "dedup_key"]
BAD_TEXT = {"nul": "a\x00b", "surrogate": "a\ud800b", "low-surrogate": "\udfff"}


@pytest.mark.parametrize("atomic", [False, True], ids=["autocommit", "atomic"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad", BAD_TEXT.values(), ids=BAD_TEXT.keys())
@pytest.mark.parametrize("field", TEXT_FIELDS)
def test_unstorable_text_is_refused_naming_its_field(field, bad, path, atomic):
    refused(path, atomic, match=field, **{field: bad})


BAD_PAYLOADS = {
    "nul-value": {"v": "\x00"},
    "surrogate-value": {"v": "x\ud800"},
    "surrogate-key": {"\udc00": 1},
    "surrogate-deep": [1, {"a": ["\ud83d"]}],
}


@pytest.mark.parametrize("atomic", [False, True], ids=["autocommit", "atomic"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("payload", BAD_PAYLOADS.values(), ids=BAD_PAYLOADS.keys())
def test_unstorable_payloads_are_refused(payload, path, atomic):
    refused(path, atomic, match=r"[Pp]ayload", payload=payload)


def test_texts_that_only_look_odd_are_stored_exactly():
    odd = "\u00e9\u4e2d\U0001f600 \\u0000 \\x00 \t\n"  # a surrogate pair, escapes as text
    sent = django_pgqueue.enqueue(odd.strip(), {odd: odd}, tenant=odd, dedup_key=odd)
    row = Message.objects.get(pk=sent.id)
    assert (row.task, row.tenant, row.dedup_key) == (odd.strip(), odd, odd)
    assert row.payload == {odd: odd}


def test_dedup_keys_that_differ_after_a_nul_do_not_collide():
    with pytest.raises(InvalidMessage, match="dedup_key"):
        django_pgqueue.enqueue("t", {}, dedup_key="k\x00-1")
    assert Message.objects.count() == 0


# --- run_after ---------------------------------------------------------------------------

FAR = {
    "timedelta-1e8-days": dt.timedelta(days=10**8),
    "timedelta-max": dt.timedelta(days=999_999_999),
    "timedelta-min": dt.timedelta(days=-999_999_999),
    "timedelta-past-earliest": dt.timedelta(days=-365 * 200),
    "datetime-max-utc": dt.datetime.max.replace(tzinfo=UTC),
    "datetime-min-utc": dt.datetime.min.replace(tzinfo=UTC),
    "datetime-min-east": dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(hours=5))),
    "datetime-max-west": dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=-5))),
    "at-latest": RUN_AFTER_LATEST,
    "before-earliest": RUN_AFTER_EARLIEST - dt.timedelta(microseconds=1),
}


@pytest.mark.parametrize("atomic", [False, True], ids=["autocommit", "atomic"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("run_after", FAR.values(), ids=FAR.keys())
def test_run_after_outside_the_range_is_refused(run_after, path, atomic):
    refused(path, atomic, match="run_after", run_after=run_after)


EDGES = {
    "earliest": RUN_AFTER_EARLIEST,
    "just-before-latest": RUN_AFTER_LATEST - dt.timedelta(microseconds=1),
    "latest-in-another-zone": (RUN_AFTER_LATEST - dt.timedelta(seconds=1)).astimezone(
        dt.timezone(dt.timedelta(hours=14))
    ),
    "a-thousand-years": dt.timedelta(days=365_000),
    "a-year-ago": dt.timedelta(days=-365),
}


@pytest.mark.parametrize("run_after", EDGES.values(), ids=EDGES.keys())
def test_run_after_inside_the_range_is_stored_and_read_back(run_after):
    sent = django_pgqueue.enqueue("t", {}, run_after=run_after)
    django_pgqueue.enqueue_many("t", [{}], run_after=run_after)
    rows = list(Message.objects.order_by("id"))
    assert rows[0].available_at == sent.available_at
    assert rows[0].available_at == rows[1].available_at or isinstance(run_after, dt.timedelta)
    if isinstance(run_after, dt.datetime):
        assert sent.available_at == run_after


@pytest.mark.parametrize("worker_id", ["w\x00x", "w\ud800"])
def test_a_worker_id_the_rows_cannot_store_is_refused_before_the_claim(worker_id):
    django_pgqueue.enqueue("t", {})
    with pytest.raises(InvalidMessage, match="worker_id"):
        Message.objects.lease("default", worker_id=worker_id)
    assert Message.objects.get().lease_token is None
