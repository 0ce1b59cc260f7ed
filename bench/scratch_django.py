"""Django on a scratch database of its own, for the self-contained benches (``flow``,
``compose``): configured in-process (child processes forked from the harness inherit it),
migrated at the start, dropped at the end."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .pg import django_database, dsn_for, scratch_database


def configure(server_dsn: str, dbname: str, pgqueue: dict[str, Any]) -> None:
    """Django settings for the bench database (once per process)."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    settings.configure(
        INSTALLED_APPS=["django_pgqueue", "bench.benchapp"],
        DATABASES={"default": django_database(dsn_for(server_dsn, dbname))},
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        # bench.benchapp's django.tasks task names its own queue: any queue is valid here.
        TASKS={"default": {"BACKEND": "django_pgqueue.tasks.PgQueueBackend", "QUEUES": []}},
        PGQUEUE=pgqueue,
    )
    django.setup()


@contextmanager
def migrated_database(server_dsn: str, dbname: str, pgqueue: dict[str, Any]) -> Iterator[None]:
    """A scratch database for the run, Django set up on it and migrated; dropped at the end."""
    with scratch_database(server_dsn, dbname):
        configure(server_dsn, dbname, pgqueue)
        from django.core.management import call_command
        from django.db import connections

        call_command("migrate", verbosity=0)
        try:
            yield
        finally:
            connections.close_all()


def execute(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def run_pool(jobs: list[tuple[Any, tuple[Any, ...]]]) -> list[int]:
    """Each ``(function, args)`` in a forked process of its own, at once; their results."""
    from django.db import connections

    connections.close_all()
    with mp.get_context("fork").Pool(len(jobs)) as pool:
        results = [pool.apply_async(fn, args) for fn, args in jobs]
        return [r.get(timeout=900) for r in results]


def checkpoint() -> None:
    """Start a run right after a checkpoint: a drain writes hundreds of MB of WAL, and a
    checkpoint that starts during a run (every 15-60 s at ``max_wal_size`` 1 GB) makes it
    write a full page image on the first change of every page after it; with one just
    before, every run pays that alike (superuser or ``pg_checkpoint``; skipped otherwise)."""
    from django.db import DatabaseError

    try:
        execute("CHECKPOINT")
    except DatabaseError:
        pass
