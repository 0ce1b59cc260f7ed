"""Retention on a real PostgreSQL: whole archive days dropped, short retentions and dead
letters deleted in batches, guards obeyed, one maintainer at a time."""

from __future__ import annotations

import datetime as dt
import io
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test import override_settings

from django_pgqueue.core import _partitions, _retention
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message
from tests.factories import DeadMessageFactory, MessageFactory

pytestmark = pytest.mark.django_db(transaction=True)

DAY = 86400.0


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def db_today() -> dt.date:
    with connection.cursor() as cursor:
        return _partitions.today(cursor)


def archive(rows: int, finished_at: dt.datetime, queue: str = "default") -> list[int]:
    """``rows`` archived messages finished at ``finished_at``; their archive ids."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_archive (message_id, queue, task, payload, finished_at) "
            "SELECT nextval('pgqueue_message_id_seq'), %s, 'tests.noop', "
            "jsonb_build_object('n', g), %s FROM generate_series(1, %s) g RETURNING id",
            [queue, finished_at, rows],
        )
        return [row[0] for row in cursor.fetchall()]


def old_day(days_ago: int) -> _partitions.Partition:
    """The day partition of ``days_ago`` days before today, created if missing."""
    day = db_today() - dt.timedelta(days=days_ago)
    _partitions.ensure_days(connection, day, day)
    return _partitions.Partition(_partitions.partition_name(day), day)


def exists(table: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [table])
        return bool(cursor.fetchone()[0])


def noon(part: _partitions.Partition) -> dt.datetime:
    return part.start + dt.timedelta(hours=12)


def drop_old_days() -> None:
    """Partitions are DDL, which a transactional test's flush does not undo."""
    first = db_today() - dt.timedelta(days=_partitions.DAYS_BEHIND)
    with connection.cursor() as cursor:
        old = [p for p in _partitions.attached_days(cursor) if p.day < first]
        for part in old:
            cursor.execute(f"DROP TABLE {part.name}")


@pytest.fixture(autouse=True)
def _only_current_days() -> Iterator[None]:
    drop_old_days()
    yield
    drop_old_days()


@pytest.fixture
def guard_ids() -> Iterator[dict[str, int | None]]:
    """A guard whose bound per source the test sets."""
    bounds: dict[str, int | None] = {"archive": None, "dead": None}

    def guard(source: str, alias: str) -> int | None:
        return bounds[source]

    _retention.register_retention_guard(guard)
    yield bounds
    _retention.unregister_retention_guard(guard)


def prune(*args: str) -> str:
    out = io.StringIO()
    call_command("pgq_prune", *args, stdout=out)
    return out.getvalue()


def test_the_migration_and_each_run_keep_days_created_ahead() -> None:
    today = db_today()
    with connection.cursor() as cursor:
        attached = {p.day for p in _partitions.attached_days(cursor)}
    # Eight days from the day the test database was migrated: today, or yesterday when the
    # suite runs across midnight.
    migrated_on = (today, today - dt.timedelta(days=1))
    assert any({day + dt.timedelta(days=n) for n in range(8)} <= attached for day in migrated_on)
    assert exists(_partitions.DEFAULT_PARTITION)

    with override_settings(PGQUEUE={"ARCHIVE_PARTITIONS_AHEAD": 12}):
        report = _retention.run_retention()
    created = [s.target for s in report.steps if s.action == "create"]
    assert _partitions.partition_name(today + dt.timedelta(days=12)) in created
    with connection.cursor() as cursor:
        attached = {p.day for p in _partitions.attached_days(cursor)}
    assert {today + dt.timedelta(days=n) for n in range(13)} <= attached
    # Rows of today and of a day without a partition both go in.
    archive(3, db_now())
    archive(2, db_now() + dt.timedelta(days=400))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {_partitions.DEFAULT_PARTITION}")
        assert cursor.fetchone()[0] == 2


def test_an_expired_day_is_dropped_whole_and_the_rest_stays() -> None:
    expired, kept = old_day(10), old_day(3)
    gone = archive(500, noon(expired))
    stay = archive(200, noon(kept)) + archive(100, db_now())
    live = MessageFactory.create_batch(5)

    with override_settings(PGQUEUE={"ARCHIVE_RETENTION": 7 * DAY}):
        report = _retention.run_retention()

    assert not exists(expired.name)  # dropped, not emptied
    assert exists(kept.name)
    assert not ArchivedMessage.objects.filter(id__in=gone).exists()
    assert ArchivedMessage.objects.filter(id__in=stay).count() == 300
    assert Message.objects.filter(id__in=[m.id for m in live]).count() == 5
    drops = [s for s in report.steps if s.action == "drop"]
    assert [s.target for s in drops] == [expired.name]
    # Nothing was deleted row by row.
    assert not [s for s in report.steps if s.action == "delete"]


def test_a_day_is_not_dropped_while_a_queue_keeps_its_rows_longer() -> None:
    expired = old_day(10)
    archive(10, noon(expired), queue="audit")
    archive(10, noon(expired), queue="default")
    settings = {"ARCHIVE_RETENTION": 7 * DAY, "QUEUES": {"audit": {"ARCHIVE_RETENTION": None}}}
    with override_settings(PGQUEUE=settings):
        report = _retention.run_retention()
    assert exists(expired.name)
    # The default queue's rows went row by row instead.
    assert ArchivedMessage.objects.filter(queue="default").count() == 0
    assert ArchivedMessage.objects.filter(queue="audit").count() == 10
    assert [(s.action, s.target, s.rows) for s in report.steps if s.source == "archive"] == [
        ("delete", 'queue "default"', 10)
    ]


def test_a_shorter_per_queue_retention_deletes_in_bounded_batches() -> None:
    two_hours_ago = db_now() - dt.timedelta(hours=2)
    short = archive(25, two_hours_ago, queue="short")
    other = archive(25, two_hours_ago, queue="other")
    fresh = archive(5, db_now(), queue="short")
    settings = {
        "ARCHIVE_RETENTION": 7 * DAY,
        "RETENTION_DELETE_BATCH": 4,
        "RETENTION_DELETE_LIMIT": 10,
        "QUEUES": {"short": {"ARCHIVE_RETENTION": 3600}},
    }
    with override_settings(PGQUEUE=settings):
        first = _retention.run_retention()
        assert ArchivedMessage.objects.filter(id__in=short).count() == 15  # 10 a run
        (step,) = [s for s in first.steps if s.action == "delete"]
        assert step.rows == 10 and "RETENTION_DELETE_LIMIT" in step.note
        _retention.run_retention()
        _retention.run_retention()
    assert not ArchivedMessage.objects.filter(id__in=short).exists()
    assert ArchivedMessage.objects.filter(id__in=other + fresh).count() == 30


def test_dead_retention_per_queue() -> None:
    old = db_now() - dt.timedelta(days=40)
    gone = DeadMessageFactory.create_batch(3, queue="default", died_at=old)
    kept_forever = DeadMessageFactory.create_batch(2, queue="keep", died_at=old)
    recent = DeadMessageFactory.create_batch(2, queue="default")
    settings = {"DEAD_RETENTION": 30 * DAY, "QUEUES": {"keep": {"DEAD_RETENTION": None}}}
    with override_settings(PGQUEUE=settings):
        report = _retention.run_retention(sources=("dead",))
    remaining = set(DeadMessage.objects.values_list("id", flat=True))
    assert remaining == {m.id for m in kept_forever + recent}
    assert not remaining & {m.id for m in gone}
    assert [(s.source, s.action, s.rows) for s in report.steps] == [("dead", "delete", 3)]


def test_a_guard_keeps_rows_it_does_not_release(guard_ids: dict[str, int | None]) -> None:
    first, second = old_day(12), old_day(11)
    default_ids = archive(4, noon(first) - dt.timedelta(days=30))  # caught by DEFAULT
    first_ids = archive(10, noon(first))
    second_ids = archive(10, noon(second))
    dead = DeadMessageFactory.create_batch(4, died_at=db_now() - dt.timedelta(days=40))
    # Released: the first day and two of the dead; not the second day.
    guard_ids["archive"] = second_ids[0]
    guard_ids["dead"] = sorted(m.id for m in dead)[2]
    with override_settings(PGQUEUE={"ARCHIVE_RETENTION": 7 * DAY}):
        report = _retention.run_retention()
    assert not exists(first.name) and exists(second.name)
    assert not ArchivedMessage.objects.filter(id__in=first_ids + default_ids).exists()
    assert ArchivedMessage.objects.filter(id__in=second_ids).count() == 10
    assert DeadMessage.objects.count() == 2
    (kept,) = [s for s in report.steps if s.action == "keep"]
    assert kept.target == f"day {second.name}" and "not exported" in kept.note


def test_pgq_prune_dry_run_then_real() -> None:
    expired = old_day(9)
    archive(7, noon(expired))
    DeadMessageFactory.create_batch(2, died_at=db_now() - dt.timedelta(days=31))
    with override_settings(PGQUEUE={"ARCHIVE_RETENTION": 7 * DAY}):
        dry = prune("--dry-run")
        assert exists(expired.name) and DeadMessage.objects.count() == 2
        real = prune()
    assert dry.splitlines() == [
        "Dry run: nothing is changed.",
        f"archive: would drop day {expired.name} (7 rows)",
        'dead: would delete 2 rows of queue "default"',
        "would expire 9 rows in " + dry.splitlines()[-1].split(" in ")[1],
    ]
    assert f"archive: dropped day {expired.name}" in real
    assert 'dead: deleted 2 rows of queue "default"' in real
    assert not exists(expired.name) and DeadMessage.objects.count() == 0
    assert prune("--dry-run").splitlines()[1] == "Nothing to expire."


def test_pgq_prune_refuses_while_another_run_holds_the_lock(admin_conn: Any) -> None:
    admin_conn.execute("SELECT pg_advisory_lock(%s)", [_retention.LOCK_KEY])
    try:
        with pytest.raises(Exception, match="another retention run holds the lock"):
            prune()
    finally:
        admin_conn.execute("SELECT pg_advisory_unlock(%s)", [_retention.LOCK_KEY])


def test_two_maintainers_at_once_do_it_once() -> None:
    expired = old_day(10)
    archive(5, noon(expired))
    barrier = threading.Barrier(4)
    results: list[Any] = []

    def maintainer(n: int) -> None:
        try:
            barrier.wait()
            results.append(_retention.maintain(worker_id=f"w{n}"))
        finally:
            connections.close_all()

    with override_settings(PGQUEUE={"ARCHIVE_RETENTION": 7 * DAY, "RETENTION_INTERVAL": 60}):
        threads = [threading.Thread(target=maintainer, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        ran = [r for r in results if r is not None]
        assert len(results) == 4 and len(ran) == 1
        assert [s.target for s in ran[0].steps if s.action == "drop"] == [expired.name]
        # Not due again before the interval has passed.
        assert _retention.maintain(worker_id="late") is None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT next_run_at - last_started_at, last_finished_at IS NOT NULL, last_report "
            "FROM pgqueue_maintenance WHERE name = 'retention'"
        )
        interval, finished, last = cursor.fetchone()
    assert interval == dt.timedelta(seconds=60) and finished
    last = json.loads(last)  # Django reads jsonb as text
    assert not last["busy"]
    assert [s["target"] for s in last["steps"] if s["action"] == "drop"] == [expired.name]


def test_a_day_detached_by_a_run_that_died_is_dropped_by_the_next() -> None:
    expired = old_day(10)
    archive(3, noon(expired))
    leftover = f"{_partitions.EXPIRED_PREFIX}{expired.day:%Y%m%d}"
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE pgqueue_archive DETACH PARTITION {expired.name}")
        cursor.execute(f"ALTER TABLE {expired.name} RENAME TO {leftover}")
    with override_settings(PGQUEUE={"ARCHIVE_RETENTION": 7 * DAY}):
        report = _retention.run_retention()
    assert not exists(leftover)
    assert ("drop", leftover) in [(s.action, s.target) for s in report.steps]


def test_without_retention_nothing_goes() -> None:
    expired = old_day(400)
    archive(3, noon(expired))
    DeadMessageFactory.create_batch(2, died_at=db_now() - dt.timedelta(days=400))
    with override_settings(PGQUEUE={"ARCHIVE_RETENTION": None, "DEAD_RETENTION": None}):
        report = _retention.run_retention()
    assert exists(expired.name) and DeadMessage.objects.count() == 2
    assert [s for s in report.steps if s.action != "create"] == []
