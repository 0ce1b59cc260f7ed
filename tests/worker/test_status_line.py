"""The worker's status line: its own rate window, whatever the heartbeat reads meanwhile."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import pytest

import django_pgqueue
from django_pgqueue.models import Message
from django_pgqueue.worker import chores

from .conftest import WorkerThread, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_status_line_counts_what_was_processed_since_the_previous_line(
    start_worker: Callable[..., WorkerThread],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="django_pgqueue")
    monkeypatch.setattr(chores, "STATUS_INTERVAL", 2.0)
    django_pgqueue.enqueue_many("tests.echo", [{"n": i} for i in range(40)])
    # A 1.5 s lease: three heartbeats (each reads its own rate) before the first status line.
    start_worker(visibility_timeout=1.5, listen=False)
    wait_for(lambda: not Message.objects.exists())

    def status_line() -> str | None:
        lines = [r.getMessage() for r in caplog.records if "processed/s" in r.getMessage()]
        return lines[0] if lines else None

    line = wait_for(status_line, timeout=5)
    rate = float(re.search(r": ([\d.]+) processed/s", line).group(1))  # type: ignore[union-attr]
    # 40 messages over the line's window of about 2 s.
    assert 10 <= rate <= 40, line
    assert " 40 processed" in line
