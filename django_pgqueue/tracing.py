"""OpenTelemetry trace context across the queue, when ``opentelemetry-api`` is installed
(the ``otel`` extra) and a tracer provider is configured.

- Enqueue injects the current context (W3C ``traceparent`` and ``tracestate``, through the
  global propagator) into the message's headers, and ``enqueue()`` runs in a PRODUCER span
  ``send <queue>``.
- The worker runs each handler in a CONSUMER span ``process <queue>``, the child of the
  context its headers carry, with OpenTelemetry's messaging attributes; an exception is
  recorded on it and sets its status to error (a ``Snooze`` is no error).

Without the package nothing is imported: the first call finds it missing, once, and every
call after costs one global read.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

from .exceptions import Snooze

__all__ = ["SYSTEM", "active", "inject", "processing", "sending"]

#: ``messaging.system`` of every span.
SYSTEM = "django_pgqueue"
#: The trace context's headers (W3C Trace Context).
TRACE_HEADERS = ("traceparent", "tracestate")

_api: SimpleNamespace | None = None
_checked = False
_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()


def _opentelemetry() -> SimpleNamespace | None:
    """The OpenTelemetry API's modules, or None when it is not installed (looked for once)."""
    global _api, _checked
    if not _checked:
        try:
            from opentelemetry import propagate, trace
            from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER
        except ImportError:
            _api = None
        else:
            _api = SimpleNamespace(
                propagate=propagate,
                trace=trace,
                provider=None,
                tracer=None,
                # A provider named by the environment is loaded by the first lookup.
                from_environment=OTEL_PYTHON_TRACER_PROVIDER in os.environ,
            )
        _checked = True
    return _api


def active() -> SimpleNamespace | None:
    """The API when a tracer provider is configured (else spans would be no-ops)."""
    api = _opentelemetry()
    if api is None:
        return None
    # Until a provider is set, get_tracer_provider() searches os.environ on every call (a
    # KeyError raised and caught, on every enqueue): the API's global says it first.
    if not api.from_environment and getattr(api.trace, "_TRACER_PROVIDER", True) is None:
        return None
    provider = api.trace.get_tracer_provider()
    if isinstance(provider, api.trace.ProxyTracerProvider):
        return None
    if provider is not api.provider:  # the first span, or a provider set anew (tests)
        api.tracer = provider.get_tracer("django_pgqueue")
        api.provider = provider
    return api


def inject(headers: dict[str, str] | None) -> dict[str, str] | None:
    """``headers`` with the current trace context added, when a span is active; the
    caller's own headers win over what the propagator writes."""
    api = _opentelemetry()
    if api is None or not api.trace.get_current_span().get_span_context().is_valid:
        return headers
    carrier: dict[str, str] = {}
    api.propagate.inject(carrier)
    if not carrier:
        return headers
    # Only the trace context: other propagators' fields (baggage) could be of any size.
    traced = {k: v for k, v in carrier.items() if k in TRACE_HEADERS and isinstance(v, str)}
    return {**traced, **headers} if headers else traced


@contextlib.contextmanager
def _span(
    api: SimpleNamespace, name: str, kind: Any, attributes: dict[str, Any], context: Any = None
) -> Iterator[Any]:
    with api.tracer.start_as_current_span(
        name,
        context=context,
        kind=kind,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except Snooze:
            raise
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(api.trace.Status(api.trace.StatusCode.ERROR, str(exc)[:200]))
            raise


def sending(queue: str, task: str) -> contextlib.AbstractContextManager[Any]:
    """A PRODUCER span ``send <queue>`` (yields it), or a no-op (yields None)."""
    api = active()
    if api is None:
        return _OFF
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": queue,
        "django_pgqueue.task": task,
    }
    return _span(api, f"send {queue}", api.trace.SpanKind.PRODUCER, attributes)


def sent(span: Any, message_id: int) -> None:
    """Name the message a :func:`sending` span sent."""
    if span is not None:
        span.set_attribute("messaging.message.id", str(message_id))


def processing(message: Any) -> contextlib.AbstractContextManager[Any]:
    """The CONSUMER span a handler of ``message`` (a leased ``Message``) runs in, the child
    of the context its headers carry; a no-op without a tracer provider."""
    api = active()
    if api is None:
        return _OFF
    headers: Mapping[str, str] | None = message.headers
    parent = api.propagate.extract(headers) if headers else None
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": message.queue,
        "messaging.message.id": str(message.id),
        "django_pgqueue.task": message.task,
        "django_pgqueue.attempt": message.attempts,
    }
    return _span(
        api, f"process {message.queue}", api.trace.SpanKind.CONSUMER, attributes, context=parent
    )
