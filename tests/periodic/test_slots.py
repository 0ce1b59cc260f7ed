"""Slots of a schedule, pure functions: cron in a time zone (DST), aligned intervals."""

from __future__ import annotations

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest

from django_pgqueue.periodic import Schedule

UTC = dt.UTC
PARIS = ZoneInfo("Europe/Paris")


def slots(schedule: Schedule, start: dt.datetime, count: int) -> list[dt.datetime]:
    found, moment = [], start
    for _ in range(count):
        moment = schedule.next_after(moment)
        found.append(moment)
    return found


def test_a_daily_time_skipped_by_the_spring_change_runs_at_the_next_valid_time() -> None:
    daily = Schedule(name="d", task="t", cron="30 2 * * *", timezone="Europe/Paris")
    # 2026-03-29: Paris jumps from 02:00 to 03:00 (CET -> CEST); 02:30 does not exist.
    start = dt.datetime(2026, 3, 28, 12, 0, tzinfo=PARIS)
    got = [s.astimezone(PARIS) for s in slots(daily, start, 3)]
    assert got == [
        dt.datetime(2026, 3, 29, 3, 0, tzinfo=PARIS),
        dt.datetime(2026, 3, 30, 2, 30, tzinfo=PARIS),
        dt.datetime(2026, 3, 31, 2, 30, tzinfo=PARIS),
    ]
    # Each is one real day (minus the skipped hour) apart: no slot lost, none doubled.
    assert all(s.tzinfo is UTC for s in slots(daily, start, 3))


def test_a_daily_time_repeated_by_the_autumn_change_runs_once() -> None:
    daily = Schedule(name="d", task="t", cron="30 2 * * *", timezone="Europe/Paris")
    # 2026-10-25: 02:00-03:00 happens twice in Paris (CEST, then CET).
    start = dt.datetime(2026, 10, 24, 12, 0, tzinfo=PARIS)
    got = slots(daily, start, 2)
    assert got[0] == dt.datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST
    assert got[1] == dt.datetime(2026, 10, 26, 1, 30, tzinfo=UTC)  # next day's 02:30 CET


def test_an_hourly_schedule_runs_every_real_hour_across_the_autumn_change() -> None:
    hourly = Schedule(name="h", task="t", cron="0 * * * *", timezone="Europe/Paris")
    start = dt.datetime(2026, 10, 24, 22, 0, tzinfo=UTC)  # 2026-10-25 00:00 CEST
    got = slots(hourly, start, 25)
    gaps = {b - a for a, b in itertools.pairwise(got)}
    assert gaps == {dt.timedelta(hours=1)}  # 25 real hours on the day with 25 hours


def test_the_same_cron_in_another_zone_is_another_instant() -> None:
    paris = Schedule(name="p", task="t", cron="0 9 * * *", timezone="Europe/Paris")
    utc = Schedule(name="u", task="t", cron="0 9 * * *")
    start = dt.datetime(2026, 7, 1, tzinfo=UTC)
    assert paris.next_after(start) == dt.datetime(2026, 7, 1, 7, 0, tzinfo=UTC)
    assert utc.next_after(start) == dt.datetime(2026, 7, 1, 9, 0, tzinfo=UTC)


def test_interval_slots_are_aligned_on_the_epoch_and_strictly_after() -> None:
    every = Schedule(name="e", task="t", every=300)
    at_slot = dt.datetime(2026, 7, 1, 10, 5, tzinfo=UTC)
    assert every.next_after(at_slot) == dt.datetime(2026, 7, 1, 10, 10, tzinfo=UTC)
    assert every.next_after(at_slot - dt.timedelta(seconds=1)) == at_slot


@pytest.mark.parametrize(
    "schedule",
    [Schedule(name="e", task="t", every=60), Schedule(name="c", task="t", cron="* * * * *")],
)
def test_the_latest_slot_of_a_downtime(schedule: Schedule) -> None:
    due = dt.datetime(2026, 7, 1, 10, 0, tzinfo=UTC)
    now = dt.datetime(2026, 7, 1, 13, 7, 30, tzinfo=UTC)
    assert schedule.latest_slot(due, now) == dt.datetime(2026, 7, 1, 13, 7, tzinfo=UTC)
    assert schedule.latest_slot(due, due) == due
