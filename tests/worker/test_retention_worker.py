"""A real ``pgq_worker`` expires an archive day while it drains its queue."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import django_pgqueue
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message
from tests.acceptance.conftest import WorkerProcess, spawn_worker  # noqa: F401 (fixture)
from tests.core.test_retention import _only_current_days, archive, exists, noon, old_day  # noqa: F401

from .conftest import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_an_expired_day_is_dropped_while_a_worker_drains(
    spawn_worker: Callable[..., WorkerProcess],  # noqa: F811
) -> None:
    expired = old_day(10)
    old_ids = archive(20_000, noon(expired))
    django_pgqueue.enqueue_many("tests.sleep", [{"seconds": 0.02}] * 600)
    enqueued = set(Message.objects.values_list("id", flat=True))

    worker = spawn_worker(
        "--concurrency",
        "2",
        "--poll-interval",
        "0.3",
        env={"DJANGO_SETTINGS_MODULE": "tests.worker.retention_settings"},
    ).ready()
    wait_for(lambda: not exists(expired.name), timeout=60)
    # About 6 s of work for two handler threads; the first retention run comes after 0.5 s.
    left_when_dropped = Message.objects.count()
    wait_for(lambda: not Message.objects.exists(), timeout=60)
    worker.wait_for_line(rf"Retention: archive: dropped day {expired.name}")

    # No message lost, none twice, none dead; the expired day's rows are gone.
    archived = list(ArchivedMessage.objects.values_list("message_id", flat=True))
    assert sorted(archived) == sorted(enqueued)
    assert not DeadMessage.objects.exists()
    assert not ArchivedMessage.objects.filter(id__in=old_ids).exists()
    # The drop happened while the worker was draining.
    assert left_when_dropped > 0
