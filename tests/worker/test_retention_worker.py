"""A real ``pgq_worker`` expires an archive day while it drains its queue."""

from __future__ import annotations

import datetime as dt
import signal
import time
from collections.abc import Callable

import pytest
from django.utils import timezone

import django_pgqueue
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message
from tests.acceptance.conftest import WorkerProcess, spawn_worker  # noqa: F401 (fixture)
from tests.core.test_retention import _only_current_days, archive, exists, noon, old_day  # noqa: F401
from tests.core.test_retention_roles import app_role, role_url  # noqa: F401 (fixture)
from tests.factories import DeadMessageFactory

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


def test_a_worker_with_dml_grants_only_drains_expires_and_warns_once(
    spawn_worker: Callable[..., WorkerProcess],  # noqa: F811
    app_role: str,  # noqa: F811
) -> None:
    """The how-to's grants are all a worker needs; the day partitions are one warning."""
    expired = old_day(10)
    old_dead = DeadMessageFactory.create_batch(3, died_at=timezone.now() - dt.timedelta(days=40))
    django_pgqueue.enqueue_many("tests.sleep", [{"seconds": 0.01}] * 50)
    enqueued = set(Message.objects.values_list("id", flat=True))

    worker = spawn_worker(
        "--poll-interval",
        "0.3",
        env={"DJANGO_SETTINGS_MODULE": "tests.worker.retention_settings"},
        database=role_url(app_role),
    ).ready()
    wait_for(lambda: not Message.objects.exists(), timeout=60)
    worker.wait_for_line(r'Retention: dead: deleted 3 rows of queue "default"')
    # Retention runs every 0.5 s: a few more runs, each meeting the same missing privilege.
    time.sleep(3)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0

    assert set(ArchivedMessage.objects.values_list("message_id", flat=True)) >= enqueued
    assert not DeadMessage.objects.filter(id__in=[m.id for m in old_dead]).exists()
    assert exists(expired.name)
    about_days = [line for line in worker.lines if "day partitions not created" in line]
    assert len(about_days) == 1 and "WARNING" in about_days[0], worker.output
    assert "Traceback" not in worker.output
