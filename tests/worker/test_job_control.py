"""Snooze and progress through a real worker on a thread, against real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import functools
import io
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone

import django_pgqueue
from django_pgqueue.core import transitions
from django_pgqueue.core._registry import registry
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message, MessageProgress
from django_pgqueue.worker.completer import Completer
from django_pgqueue.worker.heartbeat import Stats
from tests.testapp import handlers

from .conftest import WorkerThread, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
StartWorker = Callable[..., WorkerThread]


@pytest.fixture(autouse=True)
def _fresh_handler_state() -> Iterator[None]:
    handlers.snooze_runs.clear()
    handlers.progress_release.clear()
    yield
    handlers.progress_release.set()  # no handler thread left waiting


# -- snooze -----------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["tests.snooze", "tests.async-snooze"])
def test_a_snooze_runs_the_message_again_without_spending_an_attempt(
    start_worker: StartWorker, task: str
) -> None:
    # One attempt only: any snooze that spent it would leave the message dead.
    msg = django_pgqueue.enqueue(task, {"times": 5}, max_attempts=1)
    assert start_worker(burst=True).join() == 0
    row = ArchivedMessage.objects.get(message_id=msg.id)
    assert row.result == 6 and row.attempts == 1
    assert not DeadMessage.objects.exists()


def test_a_snoozed_message_waits_its_delay_with_its_attempt_given_back(
    start_worker: StartWorker,
) -> None:
    msg = django_pgqueue.enqueue("tests.snooze", {"times": 1, "seconds": 120})
    assert start_worker(burst=True).join() == 0
    row = Message.objects.get(id=msg.id)
    assert row.lease_token is None and row.attempts == 0 and row.snoozes == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now = cursor.fetchone()[0]
    assert now + dt.timedelta(seconds=110) < row.available_at < now + dt.timedelta(seconds=125)


def test_a_handler_past_its_max_snoozes_is_dead_with_a_clear_reason(
    start_worker: StartWorker,
) -> None:
    msg = django_pgqueue.enqueue("tests.snooze-twice-at-most", None, max_attempts=5)
    assert start_worker(burst=True).join() == 0
    row = DeadMessage.objects.get(message_id=msg.id)
    assert row.reason == "error"
    assert row.details["type"] == "django_pgqueue.exceptions.SnoozeLimitExceeded"
    assert "more than 2 times" in row.details["message"]
    assert row.attempts == 1  # two snoozes gave theirs back; the third run is buried at once


@override_settings(PGQUEUE={"MAX_SNOOZES": 3})
def test_the_max_snoozes_setting_bounds_handlers_without_their_own(
    start_worker: StartWorker,
) -> None:
    dead = django_pgqueue.enqueue("tests.snooze", {"times": 10})
    fine = django_pgqueue.enqueue("tests.snooze", {"times": 3})
    assert start_worker(burst=True).join() == 0
    assert DeadMessage.objects.get(message_id=dead.id).reason == "error"
    assert handlers.snooze_runs[dead.id] == 4
    assert ArchivedMessage.objects.get(message_id=fine.id).result == 4


def test_a_snooze_is_fenced_by_the_lease_and_bounded_in_sql() -> None:
    django_pgqueue.enqueue("tests.echo", None)
    [leased] = Message.objects.lease("default", worker_id="w")
    stale = transitions.snooze([(leased.id, uuid.uuid4())], [1.0], max_snoozes=5)
    assert stale.stale == [leased.id] and stale.done == []
    refused = transitions.snooze([leased], [1.0], max_snoozes=0)
    assert refused.not_snoozed == {leased.id: "limit"}
    assert Message.objects.get().lease_token == leased.lease_token  # still held
    done = transitions.snooze([leased], [1.0], max_snoozes=1)
    assert done.done == [leased.id]


def test_snooze_takes_a_delay_from_zero_to_a_year() -> None:
    assert django_pgqueue.Snooze(dt.timedelta(minutes=2)).seconds == 120.0
    for bad in (-1, float("nan"), float("inf"), 400 * 86400, "5", True):
        with pytest.raises(ValueError, match="Snooze"):
            django_pgqueue.Snooze(bad)  # type: ignore[arg-type]


# -- progress ---------------------------------------------------------------------------------


@override_settings(PGQUEUE={"PROGRESS_INTERVAL": 0})
def test_progress_is_visible_while_the_handler_runs_and_gone_after(
    start_worker: StartWorker,
) -> None:
    msg, runner, progress = _held_after_reporting(start_worker, "tests.progress", done=3)
    assert (progress.done, progress.total, progress.note) == (3, 10, "copying rows")
    assert progress.fraction == 0.3 and progress.text() == "3/10 (30%) copying rows"
    assert progress.updated_at <= timezone.now() + dt.timedelta(seconds=5)

    out = io.StringIO()
    call_command("pgq_status", stdout=out)
    assert f"#{msg.id} tests.progress on default: 3/10 (30%) copying rows" in out.getvalue()
    out = io.StringIO()
    call_command("pgq_status", "--json", stdout=out)
    [shown] = json.loads(out.getvalue())["progress"]
    assert shown["message_id"] == msg.id and shown["done"] == 3 and shown["total"] == 10

    _release(runner)
    assert ArchivedMessage.objects.get(message_id=msg.id).result == "done"
    assert django_pgqueue.get_progress(msg.id) is None
    assert not MessageProgress.objects.exists()


@override_settings(PGQUEUE={"PROGRESS_INTERVAL": 0})
def test_an_async_handler_reports_progress_without_blocking_its_loop(
    start_worker: StartWorker,
) -> None:
    _, runner, progress = _held_after_reporting(start_worker, "tests.async-progress", done=7)
    assert (progress.total, progress.note, progress.fraction) == (None, "async", None)
    _release(runner)
    assert not MessageProgress.objects.exists()


def test_the_completer_writes_progress_at_most_once_per_interval_and_deletes_it_after() -> None:
    django_pgqueue.enqueue("tests.echo", None)
    [message] = Message.objects.lease("default", worker_id="w")
    writer = Completer(
        alias="default",
        flush_interval=0,
        flush_size=10,
        stats=Stats(),
        abort=threading.Event(),
        progress_interval=0.3,
    )
    writer.progress(message, 1, 4, "first")
    writer.progress(message, 2, 4, "latest wins")
    writer.flush()
    assert MessageProgress.objects.get().note == "latest wins"
    writer.progress(message, 3, 4, "within the interval")
    writer.flush()
    assert MessageProgress.objects.get().done == 2
    time.sleep(0.35)
    writer.flush()
    assert MessageProgress.objects.get().done == 3
    writer.progress(message, 4, 4, "finishing")
    writer.complete(message, None)
    time.sleep(0.35)
    writer.flush()
    assert not MessageProgress.objects.exists()
    assert ArchivedMessage.objects.filter(message_id=message.id).exists()


def test_progress_of_a_lost_lease_is_not_written() -> None:
    django_pgqueue.enqueue("tests.echo", None)
    [message] = Message.objects.lease("default", worker_id="w")
    transitions.release([message])
    writer = Completer(
        alias="default", flush_interval=0, flush_size=10, stats=Stats(), abort=threading.Event()
    )
    writer.progress(message, 1, None, "")
    writer.flush()
    assert not MessageProgress.objects.exists()


def test_report_progress_refuses_bad_values_precisely() -> None:
    from django_pgqueue.worker.context import MessageContext

    reports: list[tuple[int, int | None, str]] = []
    make_context = functools.partial(
        MessageContext,
        message_id=1,
        task="t",
        queue="q",
        attempt=1,
        max_attempts=1,
        worker_id="w",
        lease_token=uuid.uuid4(),
    )
    context = make_context(_report_progress=lambda *report: reports.append(report))
    context.report_progress(2, 5, note="ok")
    assert reports == [(2, 5, "ok")]
    with pytest.raises(TypeError, match="done must be an int"):
        context.report_progress(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="total must be from 0"):
        context.report_progress(1, -1)
    with pytest.raises(ValueError, match="at most 200"):
        context.report_progress(1, note="x" * 201)
    with pytest.raises(ValueError, match="lone surrogate"):
        context.report_progress(1, note="\ud800")
    with pytest.raises(ValueError, match="NUL"):
        context.report_progress(1, note="a\x00b")
    with pytest.raises(RuntimeError, match="inside a worker"):
        make_context().report_progress(1)
    assert reports == [(2, 5, "ok")]


def _reported(message_id: int, *, done: int) -> django_pgqueue.Progress | None:
    progress = django_pgqueue.get_progress(message_id)
    return progress if progress is not None and progress.done == done else None


def _held_after_reporting(
    start_worker: StartWorker, task: str, *, done: int
) -> tuple[django_pgqueue.EnqueuedMessage, WorkerThread, django_pgqueue.Progress]:
    """A message of ``task`` (a progress handler) in a burst worker, and the progress it has
    reported once it reaches ``done``; the handler then waits for ``_release``."""
    msg = django_pgqueue.enqueue(task, None)
    runner = start_worker(burst=True)
    return msg, runner, wait_for(lambda: _reported(msg.id, done=done))


def _release(runner: WorkerThread) -> None:
    """Let the held progress handler finish, and the burst worker exit cleanly."""
    handlers.progress_release.set()
    assert runner.join() == 0


# -- the how-to's examples --------------------------------------------------------------------

HOWTO = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "job-control.md"


def documented_example(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", HOWTO.read_text(), re.DOTALL)
    (example,) = [block for block in blocks if marker in block]
    return example


@pytest.fixture
def registered_from_docs() -> Iterator[dict[str, Any]]:
    namespace: dict[str, Any] = {}
    yield namespace
    for name in ("reports.build", "exports.copy"):
        registry.unregister(name)


def test_the_documented_snooze_example_snoozes(
    start_worker: StartWorker, registered_from_docs: dict[str, Any]
) -> None:
    registered_from_docs.update(upstream_ready=lambda day: False, make_report=lambda day: day)
    exec(documented_example("raise django_pgqueue.Snooze(60)"), registered_from_docs)
    msg = django_pgqueue.enqueue("reports.build", {"day": "2026-12-01"})
    assert start_worker(burst=True).join() == 0
    row = Message.objects.get(id=msg.id)
    assert (row.snoozes, row.attempts, row.lease_token) == (1, 0, None)


@override_settings(PGQUEUE={"PROGRESS_INTERVAL": 0})
def test_the_documented_progress_examples_run(
    start_worker: StartWorker, registered_from_docs: dict[str, Any]
) -> None:
    exec(documented_example("context.report_progress(done, rows"), registered_from_docs)
    msg = django_pgqueue.enqueue("exports.copy", {"rows": 3000})
    assert start_worker(burst=True).join() == 0
    assert ArchivedMessage.objects.filter(message_id=msg.id).exists()
    namespace: dict[str, Any] = {"message_id": msg.id}
    exec(documented_example("get_progress(message_id)"), namespace)
    assert namespace["progress"] is None  # finished: its progress is gone
