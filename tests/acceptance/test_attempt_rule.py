"""The attempt rule with real worker processes: a handler that kills its worker spends its own
attempts, never those of the messages leased beside it (docs/explanation/guarantees.md)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest

import django_pgqueue
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message

from .conftest import WorkerProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.chaos,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]
Spawn = Callable[..., WorkerProcess]


def test_a_crashing_handler_dead_letters_only_itself(spawn_worker: Spawn) -> None:
    # Default batch size, concurrency and attempts: a worker leases the whole backlog, and
    # the crasher sits among messages that were leased beside it and never started.
    before = [django_pgqueue.enqueue("tests.echo", {"n": n}).id for n in range(30)]
    crasher = django_pgqueue.enqueue("tests.crash", {"crash": True})
    after = [django_pgqueue.enqueue("tests.echo", {"n": n}).id for n in range(30, 149)]
    innocent = before + after

    def settled() -> bool:
        return not Message.objects.exists()

    crashes = 0
    worker = None
    # A supervisor restarting the worker after every crash: the loop ends because the
    # crasher ends dead (1 crash beside others, then max_attempts crashes alone).
    for _ in range(12):
        # --queue: a worker that discovers its queues skips one holding only exhausted leases
        # (issue #25, item 6), and would never bury the crasher once it is alone.
        worker = spawn_worker(
            "--queue", "default", "--visibility-timeout", "1", "--poll-interval", "0.2"
        )
        deadline = time.monotonic() + 40
        while worker.proc.poll() is None and not settled() and time.monotonic() < deadline:
            time.sleep(0.05)
        if worker.proc.poll() is None:
            break
        assert worker.wait() == 1, worker.output
        crashes += 1
        time.sleep(1.1)  # its leases expire
    assert worker is not None and worker.proc.poll() is None, "the worker crash loop went on"
    assert settled(), worker.output[-4000:]
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output

    dead = DeadMessage.objects.get()
    assert dead.message_id == crasher.id
    assert dead.reason == "lease_expired"
    assert dead.attempts == dead.max_attempts == 3
    assert crashes == 4  # once beside others (given back), then three times alone
    archived = ArchivedMessage.objects.filter(message_id__in=innocent)
    assert archived.count() == len(innocent) == 149
    # None of them lost an attempt to the crashes.
    assert set(archived.values_list("attempts", flat=True)) == {1}
