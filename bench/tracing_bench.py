"""Headers and tracing: what message headers and OpenTelemetry cost enqueue and a drain.

Self-contained: creates and drops its own database (``pgq_tracing_bench``, or
``BENCH_TRACING_DB``) on the server named by ``BENCH_SERVER_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``)::

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

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from .scratch_django import checkpoint, configure, execute, migrated_database

SERVER_DSN = os.environ.get("BENCH_SERVER_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
DBNAME = os.environ.get("BENCH_TRACING_DB", "pgq_tracing_bench")
QUEUE = "bench"
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
        if mode == "tracing":
            from opentelemetry import trace

            span = trace.get_tracer("bench").start_as_current_span("request")
        else:
            span = None
        start = time.perf_counter()
        if span is not None:
            with span:
                for n in range(count):
                    django_pgqueue.enqueue("bench.noop", {"n": n}, queue=QUEUE, headers=headers)
        else:
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
    parser = argparse.ArgumentParser(prog="python -m bench tracing", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer messages and repetitions")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--enqueues", type=int, default=None)
    parser.add_argument("--drain", type=int, default=None)
    args = parser.parse_args(argv)
    reps = args.reps or (3 if args.quick else 5)
    enqueues = args.enqueues or (2000 if args.quick else 10000)
    drained = args.drain or (5000 if args.quick else 20000)
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise SystemExit(
            "python -m bench tracing needs opentelemetry-sdk (the dev extra)"
        ) from None
    with migrated_database(SERVER_DSN, DBNAME, {"NOTIFY": True}):
        configure(SERVER_DSN, DBNAME, {"NOTIFY": True})
        import bench.benchapp.handlers  # noqa: F401  (bench.noop)

        rates: dict[tuple[str, str], list[float]] = {}
        for rep in range(reps):
            # The modes' order turns each repetition: no mode always runs first.
            order = MODES[rep % 3 :] + MODES[: rep % 3]
            for mode in order:
                rates.setdefault(("enqueue", mode), []).append(enqueue_rate(mode, enqueues))
                rates.setdefault(("drain", mode), []).append(drain_rate(mode, drained))
        print(f"\n### Headers and tracing ({reps} repetitions, medians)\n")
        print("| measure | off | headers | tracing | headers / off | tracing / off |")
        print("|---|---:|---:|---:|---:|---:|")
        for what, label in (
            ("enqueue", f"enqueue() calls/s ({enqueues} each)"),
            ("drain", f"worker drain msg/s ({drained} no-op)"),
        ):
            med = {m: statistics.median(rates[what, m]) for m in MODES}
            print(
                f"| {label} | {med['off']:,.0f} | {med['headers']:,.0f} | {med['tracing']:,.0f}"
                f" | {med['headers'] / med['off']:.3f} | {med['tracing'] / med['off']:.3f} |"
            )


if __name__ == "__main__":
    main()
