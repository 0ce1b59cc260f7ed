"""cancel() seen by the worker: a running handler is told, a waiting one never starts, and
whatever buries the message says ``cancelled`` everywhere."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import django_pgqueue
from django_pgqueue import CancelResult
from django_pgqueue.core._registry import registry
from django_pgqueue.models import DeadMessage, Message

from .conftest import WorkerThread, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def dead_calls() -> Iterator[list[tuple[int, str]]]:
    """``tests.cancellable`` with an ``on_dead`` hook recording its calls."""
    calls: list[tuple[int, str]] = []
    original = registry.get("tests.cancellable")
    assert original is not None
    registry.unregister("tests.cancellable")
    registry.register(replace(original, on_dead=lambda i, reason: calls.append((i, reason))))
    try:
        yield calls
    finally:
        registry.unregister("tests.cancellable")
        registry.register(original)


def test_the_running_handler_sees_cancel_requested_and_is_buried_as_cancelled(
    start_worker: Callable[..., WorkerThread],
    tmp_path: Path,
    dead_calls: list[tuple[int, str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="django_pgqueue")
    started = tmp_path / "started"
    sent = django_pgqueue.enqueue(
        "tests.cancellable", {"seconds": 20, "started_file": str(started)}, max_attempts=5
    )
    # A 1.5 s lease: the heartbeat extends it (and reads the flag) every 0.5 s.
    runner = start_worker(visibility_timeout=1.5, concurrency=1, listen=False)
    wait_for(started.exists)
    assert django_pgqueue.cancel(sent.id) == CancelResult.FLAGGED
    dead = wait_for(lambda: DeadMessage.objects.filter(message_id=sent.id).first(), timeout=10)
    assert dead.reason == "cancelled"
    assert "cancel requested" in dead.details["message"]
    assert not Message.objects.filter(pk=sent.id).exists()
    assert runner.stop() == 0
    # The hook, the log line and the dead counter say what the table says.
    assert dead_calls == [(sent.id, "cancelled")]
    [line] = [r.getMessage() for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert f"Message {sent.id} (tests.cancellable on default) dead-lettered: cancelled" in line
    snapshot = runner.worker.instruments.snapshot()
    assert snapshot.dead == {("default", "tests.cancellable", "cancelled"): 1}


@pytest.mark.parametrize(
    ("listen", "visibility_timeout"),
    [
        # The LISTEN connection hears of the cancel at once; no heartbeat falls in the test.
        pytest.param(True, 60.0, id="told-by-notify"),
        # Polling only: the next heartbeat (every 0.5 s here) reads the flag.
        pytest.param(False, 1.5, id="read-by-heartbeat"),
    ],
)
def test_a_message_cancelled_while_it_waits_for_a_handler_never_starts(
    start_worker: Callable[..., WorkerThread],
    tmp_path: Path,
    dead_calls: list[tuple[int, str]],
    listen: bool,
    visibility_timeout: float,
) -> None:
    first_started, second_started = tmp_path / "first", tmp_path / "second"
    release_first = tmp_path / "release-first"
    # The first runs until the test releases it: the second waits behind it all along.
    first = django_pgqueue.enqueue(
        "tests.cancellable",
        {"seconds": 60, "started_file": str(first_started), "release_file": str(release_first)},
    )
    second = django_pgqueue.enqueue(
        "tests.cancellable", {"seconds": 0, "started_file": str(second_started)}
    )
    # One handler: the second message is leased with the first and waits for the slot.
    runner = start_worker(
        concurrency=1, listen=listen, visibility_timeout=visibility_timeout, poll_interval=30
    )
    wait_for(first_started.exists)
    assert Message.objects.get(pk=second.id).lease_token is not None
    assert django_pgqueue.cancel(second.id) == CancelResult.FLAGGED
    dead = wait_for(lambda: DeadMessage.objects.filter(message_id=second.id).first(), timeout=10)
    # Buried as soon as the worker saw the flag, not once a handler was free for it.
    assert Message.objects.filter(pk=first.id, lease_token__isnull=False).exists()
    assert dead.reason == "cancelled"
    assert dead.details["type"] == "Cancelled"
    assert "before its handler started" in dead.details["message"]
    assert not second_started.exists()
    # The hook runs once the burial has committed, so a moment after the row is visible.
    wait_for(lambda: dead_calls)
    assert dead_calls == [(second.id, "cancelled")]
    # The running one was not touched: it finishes and is archived.
    release_first.touch()
    wait_for(lambda: not Message.objects.filter(pk=first.id).exists(), timeout=10)
    assert not DeadMessage.objects.filter(message_id=first.id).exists()
    assert runner.stop() == 0
    assert not second_started.exists()
