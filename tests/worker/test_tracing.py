"""Trace context across a real worker: the handler's CONSUMER span is the child of the span
that enqueued the message (``django_pgqueue/tracing.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from django.test import override_settings

import django_pgqueue
from django_pgqueue.models import ArchivedMessage

from .conftest import WorkerThread

trace = pytest.importorskip("opentelemetry.trace")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
export = pytest.importorskip("opentelemetry.sdk.trace.export")


def _reset_globals() -> None:
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[in_memory.InMemorySpanExporter]:
    exporter = in_memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    _reset_globals()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset_globals()


pytestmark = pytest.mark.django_db(transaction=True)
StartWorker = Callable[..., WorkerThread]


def by_name(exporter: in_memory.InMemorySpanExporter) -> dict[str, list[object]]:
    found: dict[str, list[object]] = {}
    for span in exporter.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


@pytest.mark.parametrize("task", ["tests.headers", "tests.async-headers"])
def test_the_consumer_span_is_the_child_of_the_producer_span(
    start_worker: StartWorker, spans: in_memory.InMemorySpanExporter, task: str
) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        sent = django_pgqueue.enqueue(task, {}, queue="traced", headers={"request-id": "r1"})
    assert start_worker(queues=["traced"], burst=True).join() == 0
    found = by_name(spans)
    [producer] = found["send traced"]
    [consumer] = found["process traced"]
    assert producer.parent.span_id == request.get_span_context().span_id
    assert producer.kind == trace.SpanKind.PRODUCER
    assert producer.attributes["messaging.message.id"] == str(sent.id)
    assert consumer.kind == trace.SpanKind.CONSUMER
    assert consumer.context.trace_id == producer.context.trace_id
    assert consumer.parent.span_id == producer.context.span_id
    assert dict(consumer.attributes) == {
        "messaging.system": "django_pgqueue",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "traced",
        "messaging.message.id": str(sent.id),
        "django_pgqueue.task": task,
        "django_pgqueue.attempt": 1,
    }
    assert consumer.status.status_code == trace.StatusCode.UNSET
    # The handler sees the trace context beside the caller's own headers.
    result = ArchivedMessage.objects.get(message_id=sent.id).result
    assert result["request-id"] == "r1"
    assert result["traceparent"].split("-")[2] == f"{producer.context.span_id:016x}"


@override_settings(PGQUEUE={"BACKOFF_BASE": 0.0, "BACKOFF_JITTER": 0.0})
def test_a_failing_handler_records_its_exception_on_each_attempt(
    start_worker: StartWorker, spans: in_memory.InMemorySpanExporter
) -> None:
    with trace.get_tracer("test").start_as_current_span("request"):
        django_pgqueue.enqueue("tests.fail", {}, max_attempts=2)
    start_worker(burst=True).join()
    consumers = by_name(spans)["process default"]
    assert [s.attributes["django_pgqueue.attempt"] for s in consumers] == [1, 2]
    for span in consumers:
        assert span.status.status_code == trace.StatusCode.ERROR
        [event] = span.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "ValueError"


def test_a_message_enqueued_outside_any_span_starts_its_own_trace(
    start_worker: StartWorker, spans: in_memory.InMemorySpanExporter
) -> None:
    django_pgqueue.enqueue_many("tests.echo", [1, 2])
    start_worker(burst=True).join()
    consumers = by_name(spans)["process default"]
    assert len(consumers) == 2 and all(s.parent is None for s in consumers)


def test_without_a_tracer_provider_nothing_is_injected(start_worker: StartWorker) -> None:
    sent = django_pgqueue.enqueue("tests.headers", {})
    start_worker(burst=True).join()
    assert ArchivedMessage.objects.get(message_id=sent.id).result == {}
