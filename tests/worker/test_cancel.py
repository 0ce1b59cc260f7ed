"""A running handler sees cancel() at the worker's next heartbeat and its message is buried."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import django_pgqueue
from django_pgqueue import CancelResult
from django_pgqueue.models import DeadMessage, Message

from .conftest import WorkerThread, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_running_handler_sees_cancel_requested_and_is_buried_as_cancelled(
    start_worker: Callable[..., WorkerThread], tmp_path: Path
) -> None:
    started = tmp_path / "started"
    sent = django_pgqueue.enqueue(
        "tests.cancellable", {"seconds": 20, "started_file": str(started)}, max_attempts=5
    )
    # A 1.5 s lease: the heartbeat extends it (and reads the flag) every 0.5 s.
    runner = start_worker(visibility_timeout=1.5, concurrency=1)
    wait_for(started.exists)
    assert django_pgqueue.cancel(sent.id) == CancelResult.FLAGGED
    dead = wait_for(lambda: DeadMessage.objects.filter(message_id=sent.id).first(), timeout=10)
    assert dead.reason == "cancelled"
    assert "cancel requested" in dead.details["message"]
    assert not Message.objects.filter(pk=sent.id).exists()
    assert runner.stop() == 0
