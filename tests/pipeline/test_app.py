"""The pipeline is an app of its own: only ``"django_pgqueue.pipeline"`` in INSTALLED_APPS
brings its tables and its command. Real ``migrate`` runs, in a database of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from django_pgqueue.pipeline import models as pipeline_models
from tests.dsn import database_url

pytestmark = pytest.mark.django_db

PIPELINE_TABLES = {
    pipeline_models.EXPORT_RUN_TABLE,
    pipeline_models.EXPORT_RANGE_TABLE,
    pipeline_models.EXPORT_LEASE_TABLE,
    pipeline_models.STATS_TABLE,
    pipeline_models.BULK_VOTE_TABLE,
}


@pytest.fixture
def project_database() -> Iterator[str]:
    """A DATABASE_URL naming a new, empty database (dropped afterwards)."""
    url = urlsplit(database_url())
    name = f"{url.path.lstrip('/')}_apps"
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(url._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(database_url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def manage(url: str, *args: str, with_pipeline: bool) -> str:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "tests.pipeline.apps_settings",
        "PGQUEUE_WITH_PIPELINE": "1" if with_pipeline else "0",
    }
    done = subprocess.run(
        [sys.executable, "-m", "django", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {name for (name,) in rows}


def test_the_queue_app_alone_creates_no_pipeline_tables_and_the_pipeline_app_adds_them(
    project_database: str,
) -> None:
    manage(project_database, "migrate", with_pipeline=False)
    queue_only = tables(project_database)
    assert {"pgqueue_message", "pgqueue_archive", "pgqueue_dead"} <= queue_only
    assert not queue_only & PIPELINE_TABLES
    assert "pgq_pipeline" not in manage(project_database, "help", with_pipeline=False)

    manage(project_database, "migrate", with_pipeline=True)
    assert tables(project_database) - queue_only == PIPELINE_TABLES
    assert "pgq_pipeline" in manage(project_database, "help", with_pipeline=True)
