"""Pieces of the worker that need no database."""

from __future__ import annotations

import math

import pytest

from django_pgqueue.core._registry import registry
from django_pgqueue.exceptions import ResultNotSerializable
from django_pgqueue.worker.db import backoff_schedule
from django_pgqueue.worker.runner import Worker, WorkerOptions
from django_pgqueue.worker.storable import encode_result


def test_encode_result_accepts_json_and_none() -> None:
    assert encode_result(None) is None
    assert encode_result({"a": [1, "x"]}) == '{"a": [1, "x"]}'


@pytest.mark.parametrize("value", [object(), {1, 2}, math.nan])
def test_encode_result_rejects_what_json_cannot_hold(value: object) -> None:
    with pytest.raises(ResultNotSerializable, match="not JSON-serializable"):
        encode_result(value)


def test_backoff_schedule_doubles_up_to_its_cap() -> None:
    step = backoff_schedule(0.1, 0.5)
    assert [step() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]


def test_registry_knows_test_handlers_and_their_shapes() -> None:
    import tests.testapp.handlers  # noqa: F401

    effect = registry.get("tests.effect")
    echo = registry.get("tests.async-echo")
    assert effect is not None and effect.takes_context and not effect.is_async
    assert echo is not None and echo.is_async
    assert registry.get("bench.noop") is not None


def test_options_reject_a_queue_that_is_also_excluded(settings: object) -> None:
    with pytest.raises(ValueError, match="excluded"):
        Worker(WorkerOptions(queues=["a"], exclude_queues=["a"]))


def test_options_validate_queue_names() -> None:
    from django_pgqueue.exceptions import QueueNameError

    with pytest.raises(QueueNameError):
        Worker(WorkerOptions(queues=["Not A Queue!"]))


def test_heartbeat_runs_several_times_per_lease() -> None:
    worker = Worker(WorkerOptions(visibility_timeout=3))
    assert worker.heartbeat.interval == pytest.approx(1.0)


def test_prefetch_shrinks_for_slow_handlers() -> None:
    worker = Worker(WorkerOptions(concurrency=4, batch_size=100))
    assert worker.fetcher.capacity() == 4 + 200  # nothing measured yet: two batches may wait
    worker.executor.mean_run = 0.00001  # no-op handlers
    assert worker.fetcher.capacity() == 204 and worker.fetcher.refill_at() == 100
    worker.executor.mean_run = 2.0  # two-second handlers: half a second's work may wait
    assert worker.fetcher.capacity() == 4 + 2
    assert worker.fetcher.refill_at() == 1
