"""Headers and tracing: what message headers and OpenTelemetry cost enqueue and a drain.

Creates and drops its own database (``pgq_tracing_bench``, or ``BENCH_TRACING_DB``) on
``BENCH_SERVER_DSN``::

    python -m bench tracing [--quick] [--reps N] [--enqueues N] [--drain N]

Three modes, side by side in each repetition:

- ``off``: plain messages, no tracer provider (what every project without tracing runs);
- ``headers``: each message with two small headers, still no tracer provider;
- ``tracing``: an OpenTelemetry SDK tracer provider (spans batched to an exporter that drops
  them), enqueue inside an active span: a PRODUCER span and the injected trace context per
  message, a CONSUMER span per handler run.

Measured: single-message ``enqueue()`` calls in autocommit (one process), and a drain of a
backlog of no-op messages by one in-process worker (``--burst``, concurrency 4). Prints a
markdown table of medians; the ratios are against ``off``.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from .report import table
from .study import QUEUE, checkpoint, execute, migrated_database, parse, parser

DBNAME = os.environ.get("BENCH_TRACING_DB", "pgq_tracing_bench")
MODES = ("off", "headers", "tracing")
HEADERS = {"request-id": "0f6c1e2a-5d7b-4c1e-9b7e-3a1f0c2d4e5f", "origin": "bench"}


def _reset_tracer_provider() -> None:
    """OpenTelemetry sets its global provider once per process; the bench switches it."""
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


def _tracing(on: bool) -> Callable[[], None]:
    """Install (or remove) an SDK tracer provider; returns how to shut it down."""
    _reset_tracer_provider()
    if not on:
        return lambda: None
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)
    return provider.shutdown


def enqueue_rate(mode: str, count: int) -> float:
    import django_pgqueue

    execute("TRUNCATE pgqueue_message, pgqueue_archive")
    checkpoint()
    headers = HEADERS if mode != "off" else None
    shutdown = _tracing(mode == "tracing")
    try:
        span: Any = contextlib.nullcontext()
        if mode == "tracing":
            from opentelemetry import trace

            span = trace.get_tracer("bench").start_as_current_span("request")
        start = time.perf_counter()
        with span:
            for n in range(count):
                django_pgqueue.enqueue("bench.noop", {"n": n}, queue=QUEUE, headers=headers)
        return count / (time.perf_counter() - start)
    finally:
        shutdown()


def drain_rate(mode: str, count: int) -> float:
    from django.db import connections

    import django_pgqueue
    from django_pgqueue.worker.runner import Worker, WorkerOptions

    execute("TRUNCATE pgqueue_message, pgqueue_archive")
    shutdown = _tracing(mode == "tracing")
    try:
        headers = HEADERS if mode != "off" else None
        if mode == "tracing":
            # The trace context a traced request would have injected.
            headers = {
                **HEADERS,
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            }
        django_pgqueue.enqueue_many("bench.noop", [{}] * count, queue=QUEUE, headers=headers)
        execute("ANALYZE pgqueue_message")
        checkpoint()
        connections.close_all()
        worker = Worker(
            WorkerOptions(
                queues=[QUEUE],
                concurrency=4,
                batch_size=50,
                burst=True,
                install_signal_handlers=False,
            )
        )
        start = time.perf_counter()
        running = threading.Thread(target=worker.run)
        running.start()
        running.join()
        elapsed = time.perf_counter() - start
        assert not execute("SELECT 1 FROM pgqueue_message LIMIT 1"), "not drained"
        return count / elapsed
    finally:
        shutdown()


def main(argv: list[str] | None = None) -> None:
    options = parser("tracing", __doc__, reps=5, quick="fewer messages and repetitions")
    options.add_argument("--enqueues", type=int, default=10_000)
    options.add_argument("--drain", type=int, default=20_000)
    args = parse(options, argv, reps=3, enqueues=2_000, drain=5_000)
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise SystemExit(
            "python -m bench tracing needs opentelemetry-sdk (the dev extra)"
        ) from None
    with migrated_database(DBNAME, {"NOTIFY": True}):
        rates: dict[tuple[str, str], list[float]] = {}
        for rep in range(args.reps):
            # The modes' order turns each repetition: no mode always runs first.
            for mode in MODES[rep % 3 :] + MODES[: rep % 3]:
                rates.setdefault(("enqueue", mode), []).append(enqueue_rate(mode, args.enqueues))
                rates.setdefault(("drain", mode), []).append(drain_rate(mode, args.drain))
    print(f"\n### Headers and tracing ({args.reps} repetitions, medians)\n")
    rows = []
    for what, label in (
        ("enqueue", f"enqueue() calls/s ({args.enqueues} each)"),
        ("drain", f"worker drain msg/s ({args.drain} no-op)"),
    ):
        med = {m: statistics.median(rates[what, m]) for m in MODES}
        ratios = (f"{med[m] / med['off']:.3f}" for m in ("headers", "tracing"))
        rows.append([label, *(f"{med[m]:,.0f}" for m in MODES), *ratios])
    print(table("measure | off | headers | tracing | headers / off | tracing / off", rows))
