"""Retention as a role with DML grants only (docs/how-to/database-roles.md): the row deletes
run, the day partitions are one clear line, the owner runs them alone; the check says so."""

from __future__ import annotations

import datetime as dt
import io
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from django_pgqueue.checks import check_partition_privileges
from django_pgqueue.core import _retention
from django_pgqueue.models import ArchivedMessage, DeadMessage
from tests.core.test_retention import archive, db_now, drop_old_days, exists, noon, old_day
from tests.dsn import database_url
from tests.factories import DeadMessageFactory

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
GRANTS = REPO / "docs" / "how-to" / "database-roles.sql"
DAY = 86400.0
#: Dead letters expire after a day; the "emails" queue's archive after a day; a day
#: partition as a whole after a week.
RETENTION = {
    "ARCHIVE_RETENTION": 7 * DAY,
    "DEAD_RETENTION": DAY,
    "QUEUES": {"emails": {"ARCHIVE_RETENTION": DAY}},
}


@pytest.fixture(autouse=True)
def _only_current_days() -> Iterator[None]:
    drop_old_days()
    yield
    drop_old_days()


def _drop_role(name: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [name])
        if cursor.fetchone():
            cursor.execute(f'DROP OWNED BY "{name}"')
            cursor.execute(f'DROP ROLE "{name}"')


@pytest.fixture
def app_role() -> Iterator[str]:
    """A LOGIN role granted exactly what the how-to grants, the test database's owner (this
    session's role) standing for ``pgq_owner``. Roles are cluster-wide: named per database."""
    name = f"pgq_app_{connection.settings_dict['NAME']}"[:63]
    _drop_role(name)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        owner = cursor.fetchone()[0]
        cursor.execute(f'CREATE ROLE "{name}" LOGIN')
        grants = GRANTS.read_text().replace("pgq_owner", f'"{owner}"')
        cursor.execute(grants.replace("pgq_app", f'"{name}"'))
    yield name
    with connection.cursor() as cursor:
        cursor.execute("RESET ROLE")
    _drop_role(name)


@contextmanager
def as_role(name: str) -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute(f'SET ROLE "{name}"')
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")


def ddl_line(role: str) -> str:
    """What a role that neither owns the archive nor may create in its schema is told."""
    return (
        f'archive: day partitions not created or dropped: role "{role}" is not the owner of '
        'table pgqueue_archive (owner: "postgres") and lacks CREATE on schema "public"; run '
        "`manage.py pgq_prune --partitions-only` as the owner (see how-to/database-roles in "
        "the docs)"
    )


def expired_rows() -> dict[str, list[int]]:
    """Rows each kind of step expires: a day older than a week (partition drop), "emails"
    rows of two days ago (row deletes), dead letters of two days ago (row deletes)."""
    week_old = old_day(10)
    two_days = db_now() - dt.timedelta(days=2)
    return {
        "day": archive(5, noon(week_old)),
        "emails": archive(4, two_days, queue="emails"),
        "dead": [m.id for m in DeadMessageFactory.create_batch(3, died_at=two_days)],
        "fresh_dead": [m.id for m in DeadMessageFactory.create_batch(2)],
    }


def test_a_dml_role_expires_rows_and_names_the_ddl_it_cannot_run(app_role: str) -> None:
    rows = expired_rows()
    day = old_day(10)
    with override_settings(PGQUEUE=RETENTION), as_role(app_role):
        report = _retention.run_retention()

    # The DML steps ran: dead letters and the short retention's rows are gone.
    assert set(DeadMessage.objects.values_list("id", flat=True)) == set(rows["fresh_dead"])
    assert not ArchivedMessage.objects.filter(id__in=rows["emails"]).exists()
    # The DDL step did not, and says why in one line.
    assert exists(day.name)
    assert report.problems == [ddl_line(app_role)]
    assert [(s.source, s.action, s.rows) for s in report.steps] == [
        ("archive", "delete", 4),
        ("dead", "delete", 3),
    ]

    # The owner runs the partition step alone: the day goes, no row is deleted one by one.
    rows["emails_again"] = archive(2, db_now() - dt.timedelta(days=2), queue="emails")
    out = io.StringIO()
    with override_settings(PGQUEUE=RETENTION):
        call_command("pgq_prune", "--partitions-only", stdout=out)
    assert f"archive: dropped day {day.name}" in out.getvalue()
    assert not exists(day.name)
    assert ArchivedMessage.objects.filter(id__in=rows["emails_again"]).count() == 2


def test_a_missing_grant_on_one_table_is_one_line_and_the_rest_still_runs(
    app_role: str,
) -> None:
    rows = expired_rows()
    with connection.cursor() as cursor:
        cursor.execute(f'REVOKE DELETE ON pgqueue_dead FROM "{app_role}"')
    with override_settings(PGQUEUE=RETENTION), as_role(app_role):
        report = _retention.run_retention(rows=True, partitions=False)
    assert report.problems == [
        'dead: expired rows of queue "default" not deleted: permission denied for table '
        "pgqueue_dead (the role needs SELECT and DELETE on it: see how-to/database-roles in "
        "the docs)"
    ]
    assert DeadMessage.objects.filter(id__in=rows["dead"]).count() == 3
    assert not ArchivedMessage.objects.filter(id__in=rows["emails"]).exists()


def role_url(role: str) -> str:
    """The test database's URL, connecting as ``role`` (the server trusts local roles)."""
    parts = urlsplit(database_url())
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))


def prune_as(role: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py pgq_prune`` in its own process, connected as ``role``: what cron sees."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.core.retention_roles_settings",
        "DATABASE_URL": role_url(role),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "example_project")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "django", "pgq_prune", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_pgq_prune_as_a_dml_role_exits_1_with_one_line_after_expiring_what_it_may(
    app_role: str,
) -> None:
    rows = expired_rows()
    day = old_day(10)
    done = prune_as(app_role)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [f"CommandError: {ddl_line(app_role)}"]
    assert 'archive: deleted 4 rows of queue "emails"' in done.stdout
    assert 'dead: deleted 3 rows of queue "default"' in done.stdout
    assert exists(day.name) and not DeadMessage.objects.filter(id__in=rows["dead"]).exists()

    # Only the rows, as a DML role's cron job would: nothing it cannot do, exit 0.
    rows_only = prune_as(app_role, "--rows-only")
    assert rows_only.returncode == 0, rows_only.stderr
    assert rows_only.stdout.splitlines()[0] == "Nothing to expire."


def test_a_worker_with_a_dml_role_warns_once_not_every_interval(
    app_role: str, caplog: pytest.LogCaptureFixture
) -> None:
    expired_rows()
    caplog.set_level(logging.DEBUG, logger="django_pgqueue.retention")
    settings = {**RETENTION, "RETENTION_INTERVAL": 0.01}
    with override_settings(PGQUEUE=settings), as_role(app_role):
        reports = []
        for _ in range(3):
            time.sleep(0.05)
            reports.append(_retention.maintain(worker_id="w-roles"))
    assert all(r is not None and len(r.problems) == 1 for r in reports)
    about_days = [r for r in caplog.records if "day partitions not created" in r.getMessage()]
    assert [r.levelname for r in about_days] == ["WARNING", "DEBUG", "DEBUG"]
    assert not any(r.exc_info for r in caplog.records)
    assert 'dead: deleted 3 rows of queue "default"' in caplog.text


def test_the_check_warns_when_the_workers_role_cannot_create_partitions(app_role: str) -> None:
    with override_settings(PGQUEUE={"RETENTION_INTERVAL": 300.0}):
        assert check_partition_privileges(databases=["default"]) == []
        with as_role(app_role):
            (warning,) = check_partition_privileges(databases=["default"])
            # Without the database, or without retention in the workers: no query, no warning.
            assert check_partition_privileges(databases=None) == []
            with override_settings(PGQUEUE={"RETENTION_INTERVAL": None}):
                assert check_partition_privileges(databases=["default"]) == []
    assert warning.id == "django_pgqueue.W001"
    assert f'role "{app_role}" is not the owner of table pgqueue_archive' in warning.msg
    assert "pgq_prune --partitions-only" in (warning.hint or "")
