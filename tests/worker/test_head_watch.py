"""The worker's head watcher (worker/head_watch.py): while claims walk from their bounds, it
looks at the head of the claim index in its own thread, so that they take what fell due below
their bounds without ever walking from the head themselves."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator

import pytest

import django_pgqueue
from django_pgqueue.core._claim_bound import HEAD_WALK_EVERY, ClaimBounds
from django_pgqueue.worker.head_watch import HeadWatcher
from tests.bounds import bounded, claim, db_now

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def watched() -> Iterator[tuple[ClaimBounds, HeadWatcher]]:
    """Claims that walk from their bounds (any walk from the head counts as slow here), and
    their watcher, running."""
    bounds = bounded(ClaimBounds(slow_head_walk=0.0, head_walks_in_claims=False))
    stop = threading.Event()
    watcher = HeadWatcher(alias="default", bounds=bounds, stop=stop)
    watcher.start()
    yield bounds, watcher
    stop.set()
    watcher.join(10)
    assert not watcher.is_alive()


def wait_for_looks(watcher: HeadWatcher, looks: int) -> None:
    deadline = time.monotonic() + 10 * HEAD_WALK_EVERY
    while watcher.looks < looks:
        assert time.monotonic() < deadline, "the watcher did not look"
        time.sleep(0.02)


def test_the_claims_take_what_the_watcher_found_below_their_bounds(watched):
    bounds, watcher = watched
    old = django_pgqueue.enqueue("t", {"n": 1}, run_after=db_now() - dt.timedelta(hours=1)).id
    new_level = django_pgqueue.enqueue("t", {"n": 2}, priority=7).id
    assert claim(bounds) == []  # the claims alone never see them
    wait_for_looks(watcher, watcher.looks + 1)
    assert claim(bounds) == [new_level, old]
    assert bounds.start("default") is not None  # and they still walk from the bounds


def test_the_watcher_looks_only_while_claims_walk_from_bounds():
    bounds = ClaimBounds(slow_head_walk=0.5, head_walks_in_claims=False)
    django_pgqueue.enqueue("t", {"n": 0})
    assert len(claim(bounds)) == 1  # well under half a second: not slow
    bounds.walked_from_head("default", 0.6)  # as a walk over many dead entries would be
    assert bounds.bounded_queues() == ["default"]
    stop = threading.Event()
    watcher = HeadWatcher(alias="default", bounds=bounds, stop=stop)
    watcher.start()
    try:
        wait_for_looks(watcher, 1)  # fast: the claims walk from the head again...
        assert bounds.bounded_queues() == []
        assert bounds.start("default") is None
        time.sleep(2.5 * HEAD_WALK_EVERY)
        assert watcher.looks == 1  # ...and the watcher stops looking
    finally:
        stop.set()
        watcher.join(10)
    assert not watcher.is_alive()
