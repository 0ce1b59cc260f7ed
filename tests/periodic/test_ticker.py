"""Workers' ticks against real PostgreSQL: each slot once, catch-up, removal, pause, changes."""

from __future__ import annotations

import datetime as dt
import importlib
import threading
import time
from typing import Any

import pytest
from django.db import connection, connections

import django_pgqueue
from django_pgqueue.models import Message, PeriodicSchedule
from django_pgqueue.periodic import Schedule, Ticker
from django_pgqueue.tasks.framework import task

pytestmark = pytest.mark.django_db(transaction=True)

# The module, not the decorator that django_pgqueue exports under the same name.
periodic_module = importlib.import_module("django_pgqueue.periodic")

MINUTELY = Schedule(name="minutely", task="tests.echo", every=60, queue="periodic")


def make_due(name: str, ago: dt.timedelta) -> None:
    """The time seam: the schedule's slot is ``ago`` in the (database) past."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_periodic SET next_run_at = now() - %s WHERE name = %s", [ago, name]
        )


def make_due_on_its_latest_slot(name: str, every: float = 60) -> dt.datetime:
    """The time seam: the schedule is due at its latest slot on its grid (database time);
    returns that slot. Waits out a slot boundary that is about to pass, so that no later
    slot comes due before the ticker runs."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s - mod(extract(epoch FROM now()), %s)", [every, every])
        to_next_boundary = float(cursor.fetchone()[0])
        if to_next_boundary < 2:
            time.sleep(to_next_boundary + 0.1)
        cursor.execute(
            "UPDATE pgqueue_periodic"
            " SET next_run_at = to_timestamp(floor(extract(epoch FROM now()) / %s) * %s)"
            " WHERE name = %s RETURNING next_run_at",
            [every, every, name],
        )
        slot: dt.datetime = cursor.fetchone()[0]
    return slot


def slots_enqueued(name: str = "minutely") -> list[str]:
    return sorted(
        m.payload["slot"]
        for m in Message.objects.filter(queue="periodic")
        if m.payload
        if m.payload.get("periodic") == name
    )


def test_a_new_schedule_waits_for_its_next_slot_then_enqueues_it_once() -> None:
    ticker = Ticker("default", [MINUTELY])
    wait = ticker.run_due()
    row = PeriodicSchedule.objects.get(name="minutely")
    assert row.spec == "every 60s" and row.queue == "periodic" and row.task == "tests.echo"
    assert 0 <= wait <= ticker.check_interval
    assert not Message.objects.exists()

    due_slot = make_due_on_its_latest_slot("minutely")
    ticker.run_due()
    [message] = Message.objects.all()
    assert message.task == "tests.echo" and message.queue == "periodic"
    assert message.payload == {"periodic": "minutely", "slot": due_slot.isoformat()}
    row = PeriodicSchedule.objects.get(name="minutely")
    assert row.last_run_at == due_slot and row.last_message_id == message.id
    assert row.next_run_at > due_slot
    ticker.run_due()  # not due again until the next slot
    assert Message.objects.count() == 1


def test_workers_racing_for_one_slot_enqueue_it_once() -> None:
    Ticker("default", [MINUTELY]).sync()
    make_due("minutely", dt.timedelta(seconds=1))
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            ticker = Ticker("default", [MINUTELY])
            ticker._synced = True
            barrier.wait()
            ticker.run_due()
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    assert Message.objects.count() == 1


def test_after_downtime_missed_slots_are_skipped_by_default() -> None:
    # No grace: every slot past is missed (a slot within PERIODIC_GRACE would still run).
    ticker = Ticker("default", [MINUTELY], grace=0)
    ticker.sync()
    make_due("minutely", dt.timedelta(hours=3))
    ticker.run_due()
    assert not Message.objects.exists()
    row = PeriodicSchedule.objects.get(name="minutely")
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now = cursor.fetchone()[0]
    assert now < row.next_run_at <= now + dt.timedelta(seconds=60)


def test_catch_up_last_enqueues_the_latest_missed_slot_once() -> None:
    schedule = Schedule(
        name="minutely", task="tests.echo", every=60, queue="periodic", catch_up="last"
    )
    ticker = Ticker("default", [schedule], grace=0)
    ticker.sync()
    make_due("minutely", dt.timedelta(hours=3))
    ticker.run_due()
    ticker.run_due()
    [slot] = slots_enqueued()
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now = cursor.fetchone()[0]
    assert now - dt.timedelta(seconds=60) < dt.datetime.fromisoformat(slot) <= now


def test_a_schedule_removed_from_the_code_stops() -> None:
    other = Schedule(name="other", task="tests.echo", every=60, queue="periodic")
    Ticker("default", [MINUTELY, other]).sync()
    make_due("minutely", dt.timedelta(seconds=1))
    make_due("other", dt.timedelta(seconds=1))
    Ticker("default", [MINUTELY]).run_due()  # "other" is no longer in the code
    assert len(slots_enqueued("minutely")) == 1
    assert slots_enqueued("other") == []
    assert PeriodicSchedule.objects.get(name="other").last_run_at is None


def test_a_paused_schedule_is_not_enqueued() -> None:
    ticker = Ticker("default", [MINUTELY])
    ticker.sync()
    make_due("minutely", dt.timedelta(seconds=1))
    PeriodicSchedule.objects.filter(name="minutely").update(paused=True)
    ticker.run_due()
    assert not Message.objects.exists()


def test_a_changed_timing_starts_again_from_its_next_slot() -> None:
    Ticker("default", [MINUTELY]).sync()
    make_due("minutely", dt.timedelta(days=1))
    hourly = Schedule(name="minutely", task="tests.echo", cron="0 * * * *", queue="periodic")
    Ticker("default", [hourly]).sync()
    row = PeriodicSchedule.objects.get(name="minutely")
    assert row.spec == "cron 0 * * * * UTC"
    assert row.next_run_at.minute == 0 and row.next_run_at.second == 0
    # The same declaration again changes nothing.
    Ticker("default", [hourly]).sync()
    assert PeriodicSchedule.objects.get(name="minutely").updated_at == row.updated_at


def test_the_decorator_takes_the_handlers_name_and_queue(monkeypatch: Any) -> None:
    monkeypatch.setattr(periodic_module, "_SCHEDULES", {})

    @django_pgqueue.periodic(every=dt.timedelta(minutes=5), payload={"x": 1})
    @django_pgqueue.handler("tests.periodic-decorated", queue="reports")
    def decorated(payload: Any) -> None:
        pass

    [schedule] = periodic_module.schedules()
    assert (schedule.name, schedule.task, schedule.queue) == (
        "tests.periodic-decorated",
        "tests.periodic-decorated",
        "reports",
    )
    assert schedule.every == 300 and schedule.payload == {"x": 1}


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((), {}, "exactly one"),
        (("* * * * *",), {"every": 60}, "exactly one"),
        (("61 * * * *",), {}, "invalid cron"),
        (("* * * * *",), {"timezone": "Mars/Olympus"}, "unknown time zone"),
        ((), {"every": 0.5}, "at least 1 second"),
        (("* * * * *",), {"catch_up": "all"}, "catch_up"),
    ],
)
def test_bad_declarations_fail_at_import(args: Any, kwargs: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        django_pgqueue.periodic(*args, **kwargs)


def test_an_unregistered_function_is_refused() -> None:
    with pytest.raises(TypeError, match="not a registered handler"):
        django_pgqueue.periodic(every=60)(lambda payload: None)


def test_the_decorator_takes_a_tasks_task_with_no_arguments(monkeypatch: Any) -> None:
    monkeypatch.setattr(periodic_module, "_SCHEDULES", {})
    django_pgqueue.periodic("0 3 * * *", timezone="Europe/Paris")(nightly)
    [schedule] = periodic_module.schedules()
    assert schedule.task == nightly.module_path and schedule.queue == "default"
    assert schedule.payload == {"args": [], "kwargs": {}}
    assert schedule.spec == "cron 0 3 * * * Europe/Paris"


@task
def nightly() -> None:
    """A Tasks task (defined at module level, as Django requires) for the test above."""
