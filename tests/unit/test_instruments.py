"""The worker's instruments (``metrics/instruments.py``): what a scrape of them reports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_pgqueue.core._registry import Handler, registry
from django_pgqueue.metrics.instruments import (
    BATCH_BUCKETS,
    UNREGISTERED_TASK,
    Histogram,
    Instruments,
)


@pytest.fixture
def registered() -> Iterator[None]:
    """Tasks ``t`` and ``f`` have handlers, as a worker's would."""
    for name in ("t", "f"):
        registry.register(Handler(name, print, is_async=False, takes_context=False))
    yield
    for name in ("t", "f"):
        registry.unregister(name)


def test_a_value_on_a_bound_falls_in_that_bound_bucket() -> None:
    histogram = Histogram((1.0, 2.0))
    for value in (0.5, 1.0, 1.5, 2.0, 9.0):
        histogram.observe(value)
    assert histogram.counts == [2, 2, 1]  # <= 1, (1, 2], +Inf
    assert histogram.total == 14.0


@pytest.mark.usefixtures("registered")
def test_a_snapshot_is_a_copy() -> None:
    instruments = Instruments()
    instruments.claimed("q", 0)
    instruments.claimed("q", 7)
    instruments.archived([("q", "t"), ("q", "t")])
    instruments.failures(
        failed=[("q", "f"), ("q", "f")], retried=[("q", "f")], dead=[("q", "f", "error")]
    )
    snapshot = instruments.snapshot()
    instruments.claimed("q", 3)
    instruments.archived([("q", "t")])
    batches = snapshot.batches["q"]
    assert batches.counts[0] == 1 and sum(batches.counts) == 2 and batches.total == 7
    assert len(batches.counts) == len(BATCH_BUCKETS) + 1
    assert snapshot.processed == {("q", "t"): 2}
    assert snapshot.failed == {("q", "f"): 2} and snapshot.retried == {("q", "f"): 1}
    assert snapshot.dead == {("q", "f", "error"): 1}
    assert instruments.snapshot().processed == {("q", "t"): 3}


@pytest.mark.usefixtures("registered")
def test_tasks_without_a_handler_share_one_label() -> None:
    instruments = Instruments()
    instruments.failures(
        failed=[("q", f"sent-by-anyone-{n}") for n in range(100)] + [("q", "f")],
        retried=[("q", "sent-by-anyone-0")],
        dead=[("q", f"sent-by-anyone-{n}", "rejected") for n in range(1, 100)],
    )
    instruments.archived([("q", "t"), ("q", "gone")])
    instruments.handler_ran("q", "gone", 0.1)
    snapshot = instruments.snapshot()
    assert snapshot.failed == {("q", UNREGISTERED_TASK): 100, ("q", "f"): 1}
    assert snapshot.retried == {("q", UNREGISTERED_TASK): 1}
    assert snapshot.dead == {("q", UNREGISTERED_TASK, "rejected"): 99}
    assert snapshot.processed == {("q", "t"): 1, ("q", UNREGISTERED_TASK): 1}
    assert list(snapshot.durations) == [("q", UNREGISTERED_TASK)]
