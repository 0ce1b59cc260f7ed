"""Claims with a claimer's bounds (core/_claim_bound.py), for the tests of the bounds and of
the worker's head watcher."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import connection, transaction

import django_pgqueue
from django_pgqueue.core import _claim
from django_pgqueue.core._claim_bound import ClaimBounds


def claim(bounds: ClaimBounds) -> list[int]:
    """The ids one claim of queue ``default`` with ``bounds`` takes (at most 10)."""
    leased = _claim.lease("default", worker_id="w1", batch_size=10, bounds=bounds)
    return [m.id for m in leased]


def until_the_head_walk_is_due(bounds: ClaimBounds) -> None:
    """Wait until the next claim of queue ``default`` walks from the head: HEAD_WALK_EVERY
    after the last walk from the head, or longer after a slow one (a loaded machine)."""
    deadline = time.monotonic() + 30
    while bounds.start("default") is not None:
        assert time.monotonic() < deadline, "the walk from the head never fell due"
        time.sleep(0.05)


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def bounded(bounds: ClaimBounds) -> ClaimBounds:
    """``bounds`` (which takes any walk from the head as slow) after a claim from the head
    that left nothing behind: its next claim of the queue walks from a bound."""
    first = django_pgqueue.enqueue("t", {"n": 0}).id
    assert claim(bounds) == [first]
    assert bounds.start("default") is not None
    return bounds


@contextmanager
def committed_late(enqueue: Callable[[], list[int]]) -> Iterator[list[int]]:
    """Runs ``enqueue`` in a transaction of another connection that stays open for the body
    of the ``with`` and commits at its end; yields the ids it returned."""
    enqueued, committed, go = threading.Event(), threading.Event(), threading.Event()
    late: list[int] = []

    def enqueue_in_a_long_transaction() -> None:
        try:
            with transaction.atomic():
                late.extend(enqueue())
                enqueued.set()
                go.wait(30)
        finally:
            connection.close()
            committed.set()

    writer = threading.Thread(target=enqueue_in_a_long_transaction)
    writer.start()
    assert enqueued.wait(30)
    try:
        yield late
    finally:
        go.set()
        assert committed.wait(30)
        writer.join()
