"""Periodic jobs declared in code, enqueued by the workers themselves: no beat process.

``@periodic("*/5 * * * *", timezone="Europe/Paris")`` (a cron expression, read by
``cronsim``) or ``@periodic(every=timedelta(minutes=5))`` (slots aligned on the Unix epoch)
on a handler or a ``django.tasks`` task declares a schedule. Every worker checks the schedules
in its main loop (:class:`Ticker`); each schedule's row in ``pgqueue_periodic`` holds the slot
it waits for, and the worker that finds it due moves it on with a compare-and-set on
``next_run_at`` in the same transaction as the enqueue: however many workers look at once,
each slot is enqueued exactly once. All times are database time.

After downtime, ``catch_up="skip"`` (the default) drops the slots that are more than
``PERIODIC_GRACE`` seconds late; ``catch_up="last"`` enqueues the latest missed slot once.
Either way the schedule then waits for its next slot after now. A schedule removed from the
code is no longer looked at: its row stays (for the admin's history) but nothing enqueues it.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.db import DatabaseError, connections, transaction

from .conf import get_settings
from .core import _periodic_sql
from .core._enqueue import enqueue
from .core._validation import (
    encode_payload,
    validate_priority,
    validate_queue_name,
    validate_task_name,
)

__all__ = ["Schedule", "Ticker", "periodic", "run_now", "schedules"]

logger = logging.getLogger("django_pgqueue.periodic")

CatchUp = Literal["skip", "last"]
T = TypeVar("T")

#: Upper bound of slots walked to find the latest missed one (cron only; intervals compute it).
MAX_SLOTS_WALKED = 100_000

_UTC = dt.UTC


@dataclass(frozen=True)
class Schedule:
    """One periodic job: what to enqueue, and when (``cron`` in ``timezone``, or ``every``)."""

    name: str
    task: str
    cron: str | None = None
    every: float | None = None  # seconds
    timezone: str = "UTC"
    queue: str | None = None
    payload: Any = None
    priority: int = 0
    catch_up: CatchUp = "skip"

    @property
    def spec(self) -> str:
        """What identifies the timing: a change of it restarts the schedule from now."""
        if self.cron is not None:
            return f"cron {self.cron} {self.timezone}"
        return f"every {self.every:g}s"

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        """The first slot strictly after ``moment`` (an aware datetime)."""
        if self.every is not None:
            epoch = moment.timestamp()
            slot = (math.floor(epoch / self.every) + 1) * self.every
            return dt.datetime.fromtimestamp(slot, _UTC)
        assert self.cron is not None
        local = moment.astimezone(ZoneInfo(self.timezone))
        return next(CronSim(self.cron, local)).astimezone(_UTC)

    def latest_slot(self, due: dt.datetime, now: dt.datetime) -> dt.datetime:
        """The latest slot in ``[due, now]`` (``due`` itself when none is later)."""
        if self.every is not None:
            slot = math.floor(now.timestamp() / self.every) * self.every
            return max(due, dt.datetime.fromtimestamp(slot, _UTC))
        latest = due
        for _ in range(MAX_SLOTS_WALKED):
            following = self.next_after(latest)
            if following > now:
                break
            latest = following
        return latest

    def payload_for(self, slot: dt.datetime) -> Any:
        if self.payload is not None:
            return self.payload
        return {"periodic": self.name, "slot": slot.isoformat()}


_SCHEDULES: dict[str, Schedule] = {}


def schedules() -> list[Schedule]:
    """The schedules declared so far (importing the handlers modules declares them)."""
    return list(_SCHEDULES.values())


def register(schedule: Schedule) -> Schedule:
    """Declare ``schedule`` (what :func:`periodic` does); a second one of the same name
    replaces the first (a module imported again)."""
    _SCHEDULES[schedule.name] = schedule
    return schedule


def unregister(name: str) -> None:
    _SCHEDULES.pop(name, None)


def _task_of(target: Any) -> tuple[str, str | None, Any]:
    """Task name, queue and payload of what ``@periodic`` decorates: a ``django.tasks``
    task (enqueued as the Tasks backend does, with no arguments) or a registered handler."""
    module_path = getattr(target, "module_path", None)
    if isinstance(module_path, str) and hasattr(target, "queue_name"):
        return module_path, getattr(target, "queue_name", None), {"args": [], "kwargs": {}}
    from .core._registry import registry

    for handler in registry.handlers():
        if handler.func is target:
            return handler.name, handler.queue, None
    raise TypeError(
        "@periodic goes above @django_pgqueue.handler(...) or a django.tasks @task "
        "(or pass task='name'); this function is not a registered handler"
    )


def periodic(
    cron: str | None = None,
    *,
    every: dt.timedelta | float | None = None,
    timezone: str = "UTC",
    queue: str | None = None,
    payload: Any = None,
    priority: int = 0,
    catch_up: CatchUp = "skip",
    name: str | None = None,
    task: str | None = None,
) -> Callable[[T], T]:
    """Enqueue the decorated handler's (or Tasks task's) task on a schedule.

    ``cron``: a five-field cron expression evaluated in ``timezone`` (an IANA name; daylight
    saving changes follow Debian cron: a time skipped in spring runs at the next valid time,
    a repeated one runs once), or ``every``: a period (``timedelta`` or seconds >= 1), slots
    aligned on the Unix epoch. ``payload``: what each message carries (default
    ``{"periodic": name, "slot": "<ISO time of the slot>"}``; a Tasks task gets no arguments).
    ``catch_up``: ``"skip"`` drops slots more than ``PERIODIC_GRACE`` seconds late (after
    downtime), ``"last"`` enqueues the latest missed one. ``name`` tells apart several
    schedules of one task (default: the task name).
    """
    if (cron is None) == (every is None):
        raise ValueError("@periodic needs exactly one of a cron expression or every=")
    seconds: float | None = None
    if every is not None:
        seconds = every.total_seconds() if isinstance(every, dt.timedelta) else float(every)
        if not seconds >= 1:
            raise ValueError(f"every= must be at least 1 second; got {every!r}")
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {timezone!r}") from exc
    if cron is not None:
        try:
            CronSim(cron, dt.datetime.now(zone))
        except CronSimError as exc:
            raise ValueError(f"invalid cron expression {cron!r}: {exc}") from exc
    if catch_up not in ("skip", "last"):
        raise ValueError(f"catch_up must be 'skip' or 'last'; got {catch_up!r}")
    validate_priority(priority)
    if queue is not None:
        validate_queue_name(queue)
    if payload is not None:
        encode_payload(payload, get_settings().MAX_PAYLOAD_BYTES)

    def decorate(target: T) -> T:
        task_name, task_queue, task_payload = (task, None, None) if task else _task_of(target)
        validate_task_name(task_name)
        register(
            Schedule(
                name=name or task_name,
                task=task_name,
                cron=cron,
                every=seconds,
                timezone=timezone,
                queue=queue or task_queue,
                payload=payload if payload is not None else task_payload,
                priority=priority,
                catch_up=catch_up,
            )
        )
        return target

    return decorate


def run_now(name: str, *, using: str | None = None) -> int:
    """Enqueue schedule ``name`` once now, outside its slots (the admin's "Run now"); its
    slots go on unchanged. Returns the message id; ``LookupError`` if the code does not
    declare it."""
    schedule = _SCHEDULES.get(name)
    if schedule is None:
        raise LookupError(f"no periodic schedule {name!r} is declared in the code")
    alias = using or get_settings().DATABASE_ALIAS
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(_periodic_sql.NOW)
        now = cursor.fetchone()[0]
        sent = enqueue(
            schedule.task,
            schedule.payload_for(now),
            queue=schedule.queue,
            priority=schedule.priority,
            using=alias,
        )
        cursor.execute(_periodic_sql.RAN_NOW, [sent.id, name])
    return sent.id


#: Longest a worker waits between two looks at the schedules (it also wakes at each one's next
#: slot): bounds how soon a schedule paused or resumed in the admin is seen.
CHECK_INTERVAL = 5.0


class Ticker:
    """A worker's view of the schedules: :meth:`run_due` enqueues what is due."""

    def __init__(
        self, alias: str, declared: Iterable[Schedule] | None = None, *, grace: float | None = None
    ) -> None:
        self.alias = alias
        self.schedules = {s.name: s for s in (schedules() if declared is None else declared)}
        self.grace = get_settings().PERIODIC_GRACE if grace is None else grace
        self.check_interval = CHECK_INTERVAL
        self._synced = False

    def __bool__(self) -> bool:
        return bool(self.schedules)

    def sync(self) -> None:
        """Write the declared schedules' rows (once per worker start)."""
        with connections[self.alias].cursor() as cursor:
            cursor.execute(_periodic_sql.NOW)
            now = cursor.fetchone()[0]
            for s in self.schedules.values():
                queue = s.queue or get_settings().DEFAULT_QUEUE
                cursor.execute(
                    _periodic_sql.UPSERT_SCHEDULE,
                    [s.name, s.task, queue, s.spec, s.next_after(now)],
                )
        self._synced = True

    def run_due(self) -> float:
        """Enqueue every due slot; returns the seconds until the next check. Database errors
        are logged and retried at the next check (a slot is never lost: its row waits)."""
        if not self.schedules:
            return self.check_interval
        started = time.monotonic()
        try:
            if not self._synced:
                self.sync()
            wait = self._run_due()
        except DatabaseError:
            logger.exception("Could not check the periodic schedules; trying again shortly.")
            return self.check_interval
        return max(0.0, min(wait, self.check_interval) - (time.monotonic() - started))

    def _run_due(self) -> float:
        with connections[self.alias].cursor() as cursor:
            cursor.execute(_periodic_sql.DUE_SCHEDULES, [list(self.schedules)])
            rows = cursor.fetchall()
        wait = self.check_interval
        for name, next_run_at, due, seconds_left, now in rows:
            if not due:
                wait = min(wait, seconds_left)
                continue
            following = self._fire(self.schedules[name], next_run_at, now)
            # Won or lost, the schedule waits for its next slot now.
            wait = min(wait, (following - now).total_seconds())
        return wait

    def _fire(self, schedule: Schedule, due: dt.datetime, now: dt.datetime) -> dt.datetime:
        """Enqueue ``schedule``'s slot if this worker wins it; returns the next slot."""
        slot: dt.datetime | None = schedule.latest_slot(due, now)
        assert slot is not None
        late = (now - slot).total_seconds()
        if schedule.catch_up == "skip" and late > self.grace:
            slot = None  # missed during downtime: skipped
        following = schedule.next_after(now)
        with transaction.atomic(using=self.alias), connections[self.alias].cursor() as cursor:
            # The claim session commits asynchronously; a schedule's move must be durable.
            cursor.execute(_periodic_sql.SYNCHRONOUS_COMMIT)
            cursor.execute(_periodic_sql.ADVANCE, [following, slot, schedule.name, due])
            if cursor.fetchone() is None:
                return following  # another worker took this slot
            if slot is None:
                logger.info(
                    "Periodic %s: skipped the slots missed since %s (catch_up='skip').",
                    schedule.name,
                    due.isoformat(),
                )
                return following
            sent = enqueue(
                schedule.task,
                schedule.payload_for(slot),
                queue=schedule.queue,
                priority=schedule.priority,
                using=self.alias,
            )
            cursor.execute(_periodic_sql.RAN_SLOT, [sent.id, schedule.name])
        logger.info(
            "Periodic %s: enqueued message %s for the slot %s.",
            schedule.name,
            sent.id,
            slot.isoformat(),
        )
        return following
