"""The worker's instruments (``metrics/instruments.py``): what a scrape of them reports."""

from __future__ import annotations

from django_pgqueue.metrics.instruments import BATCH_BUCKETS, Histogram, Instruments


def test_a_value_on_a_bound_falls_in_that_bound_bucket() -> None:
    histogram = Histogram((1.0, 2.0))
    for value in (0.5, 1.0, 1.5, 2.0, 9.0):
        histogram.observe(value)
    assert histogram.counts == [2, 2, 1]  # <= 1, (1, 2], +Inf
    assert histogram.total == 14.0


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
