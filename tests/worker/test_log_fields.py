"""Every worker log record about one message carries ``message_id``, ``task``, ``queue`` and
``attempt`` as fields of its own (``extra``), for JSON log pipelines."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from django.test import override_settings

import django_pgqueue

from .conftest import WorkerThread

pytestmark = pytest.mark.django_db(transaction=True)
StartWorker = Callable[..., WorkerThread]


def about(caplog: pytest.LogCaptureFixture, message_id: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "message_id", None) == message_id]


@override_settings(PGQUEUE={"BACKOFF_BASE": 0.0, "BACKOFF_JITTER": 0.0})
def test_retries_and_dead_lettering_carry_the_message_fields(
    start_worker: StartWorker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="django_pgqueue")
    sent = django_pgqueue.enqueue("tests.fail", {}, queue="logged", max_attempts=2)
    start_worker(queues=["logged"], burst=True).join()
    records = about(caplog, sent.id)
    assert [(r.levelname, r.attempt) for r in records] == [("INFO", 1), ("WARNING", 2)]
    assert "retrying" in records[0].getMessage()
    assert "dead-lettered" in records[1].getMessage()
    assert all(r.task == "tests.fail" and r.queue == "logged" for r in records)


def test_a_timeout_carries_the_message_fields(
    start_worker: StartWorker, caplog: pytest.LogCaptureFixture
) -> None:
    sent = django_pgqueue.enqueue("tests.timeout", {"seconds": 1}, max_attempts=1)
    start_worker(burst=True, concurrency=2).join()
    [timed_out, buried] = about(caplog, sent.id)
    assert "timed out" in timed_out.getMessage()
    assert (timed_out.task, timed_out.queue, timed_out.attempt) == ("tests.timeout", "default", 1)
    assert "dead-lettered: timeout" in buried.getMessage()


def test_a_snooze_carries_the_message_fields(
    start_worker: StartWorker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="django_pgqueue")
    sent = django_pgqueue.enqueue("tests.snooze", {"times": 1, "seconds": 0})
    start_worker(burst=True).join()
    [snoozed] = [r for r in about(caplog, sent.id) if "snoozed" in r.getMessage()]
    assert (snoozed.task, snoozed.attempt) == ("tests.snooze", 1)
