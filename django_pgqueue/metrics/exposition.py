"""Prometheus samples: the queue gauges (read from the database at each scrape) and one
worker's counters (kept in its process, ``metrics/instruments.py``).

Needs ``prometheus_client`` (``pip install "django-pgqueue-mq[metrics]"``); importing this
module without it raises :class:`~django.core.exceptions.ImproperlyConfigured` saying so.
Each exposition builds its own ``CollectorRegistry``: nothing is registered in
``prometheus_client``'s default registry, so several workers embedded in one process, or a
project's own metrics, never clash with these.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        InfoMetricFamily,
    )
    from prometheus_client.utils import floatToGoString
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    raise ImproperlyConfigured(
        "django_pgqueue's metrics need the prometheus_client package: "
        'pip install "django-pgqueue-mq[metrics]"'
    ) from exc

from .instruments import Histogram
from .queues import Snapshot, read_gauges

if TYPE_CHECKING:
    from ..worker.runner import Worker

__all__ = ["CONTENT_TYPE_LATEST", "QueueCollector", "WorkerCollector", "render"]

STATES = ("ready", "scheduled", "in_flight", "dead")


class QueueCollector:
    """The ``pgqueue_queue_*`` gauges and the totals, read when scraped."""

    def __init__(self, *, using: str | None = None) -> None:
        self.using = using

    def describe(self) -> list[Any]:
        return []  # no query at registration

    def collect(self) -> Iterator[Any]:
        yield from queue_families(read_gauges(using=self.using))


def queue_families(snapshot: Snapshot) -> Iterator[Any]:
    messages = GaugeMetricFamily(
        "pgqueue_queue_messages",
        "Messages per queue and state (ready, scheduled, in_flight, dead), counted up to "
        "pgqueue_metrics_count_cap.",
        labels=["queue", "state"],
    )
    capped = GaugeMetricFamily(
        "pgqueue_queue_messages_capped",
        "1 when pgqueue_queue_messages stopped at the cap: the value is a lower bound.",
        labels=["queue", "state"],
    )
    oldest = GaugeMetricFamily(
        "pgqueue_queue_oldest_ready_age_seconds",
        "How long the oldest ready message of the queue has been waiting (0: none ready).",
        labels=["queue"],
    )
    paused = GaugeMetricFamily(
        "pgqueue_queue_paused", "1 when the queue is paused.", labels=["queue"]
    )
    for q in snapshot.queues:
        for state in STATES:
            count = getattr(q, state)
            messages.add_metric([q.name, state], count.value)
            capped.add_metric([q.name, state], 1 if count.capped else 0)
        oldest.add_metric([q.name], q.oldest_ready_seconds)
        paused.add_metric([q.name], 1 if q.paused else 0)
    yield from (messages, capped, oldest, paused)
    yield GaugeMetricFamily(
        "pgqueue_workers_live",
        "Workers whose heartbeat is recent (the pgqueue_worker table).",
        value=snapshot.live_workers,
    )
    estimates = GaugeMetricFamily(
        "pgqueue_table_rows_estimate",
        "The planner's row estimate of each table (pg_class.reltuples), after a vacuum or analyze.",
        labels=["table"],
    )
    for table, rows in sorted(snapshot.estimated_rows.items()):
        estimates.add_metric([table], rows)
    yield estimates
    yield GaugeMetricFamily(
        "pgqueue_metrics_count_cap",
        "The cap of pgqueue_queue_messages: counts stop there.",
        value=snapshot.cap,
    )


class WorkerCollector:
    """One worker's ``pgqueue_worker_*`` counters, histograms and state."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        worker = self.worker
        snap = worker.instruments.snapshot()
        info = InfoMetricFamily("pgqueue_worker", "This worker process.")
        info.add_metric([], {"worker_id": worker.worker_id, "hostname": worker.hostname})
        yield info
        yield _counter(
            "pgqueue_worker_messages_processed",
            "Messages archived after their handler succeeded.",
            ["queue", "task"],
            snap.processed.items(),
        )
        yield _counter(
            "pgqueue_worker_messages_failed",
            "Failed attempts recorded (each one then retried or dead-lettered).",
            ["queue", "task"],
            snap.failed.items(),
        )
        yield _counter(
            "pgqueue_worker_messages_retried",
            "Failed attempts scheduled to run again.",
            ["queue", "task"],
            snap.retried.items(),
        )
        yield _counter(
            "pgqueue_worker_messages_dead",
            "Messages this worker moved to the dead table, by reason.",
            ["queue", "task", "reason"],
            snap.dead.items(),
        )
        yield _histogram(
            "pgqueue_worker_handler_duration_seconds",
            "Handler run time of the messages whose handler returned or raised.",
            ["queue", "task"],
            ((list(key), h) for key, h in snap.durations.items()),
        )
        yield _histogram(
            "pgqueue_worker_claim_batch_size",
            "Messages leased per claim (0: the claim found nothing).",
            ["queue"],
            (([queue], h) for queue, h in snap.batches.items()),
        )
        yield CounterMetricFamily(
            "pgqueue_worker_listener_reconnects",
            "Times the LISTEN connection was lost (or deaf) and connected again.",
            value=snap.listener_reconnects,
        )
        yield GaugeMetricFamily(
            "pgqueue_worker_in_flight",
            "Messages leased by this worker: running or waiting for a handler.",
            value=worker.executor.in_flight(),
        )
        yield GaugeMetricFamily(
            "pgqueue_worker_concurrency", "Handlers this worker runs at once.", worker.concurrency
        )
        yield GaugeMetricFamily(
            "pgqueue_worker_draining",
            "1 once the worker stopped taking messages (a signal, --burst done, or a fault).",
            value=1 if worker.draining else 0,
        )
        yield GaugeMetricFamily(
            "pgqueue_worker_database_silence_seconds",
            "Seconds since the worker's last successful database round trip.",
            value=worker.database_silence(),
        )


def _counter(
    name: str, documentation: str, labels: list[str], values: Iterable[tuple[tuple[str, ...], int]]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=labels)
    for key, value in sorted(values):
        family.add_metric(list(key), value)
    return family


def _histogram(
    name: str,
    documentation: str,
    labels: list[str],
    values: Iterable[tuple[list[str], Histogram]],
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for key, histogram in sorted(values, key=lambda item: item[0]):
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip([*histogram.bounds, float("inf")], histogram.counts, strict=True):
            running += count
            buckets.append((floatToGoString(bound), running))
        family.add_metric(key, buckets, sum_value=histogram.total)
    return family


def render(*collectors: Any) -> tuple[str, bytes]:
    """``(content type, body)`` of the text exposition of ``collectors``."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return CONTENT_TYPE_LATEST, generate_latest(registry)
