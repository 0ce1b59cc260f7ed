"""What the study benches (``flow``, ``compose``, ``tracing``, ``processes``, ``pipeline``,
``export``) share: the server (``BENCH_SERVER_DSN``), their common options, and Django on a
scratch database of their own, configured in-process (forked children inherit it), migrated
at the start and dropped at the end."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .pg import SERVER_DSN, django_database, dsn_for, scratch_database

if TYPE_CHECKING:
    from django_pgqueue.worker.runner import Worker

QUEUE = "bench"


def parser(name: str, doc: str, *, reps: int, quick: str) -> argparse.ArgumentParser:
    """The options of ``python -m bench <name>``, ``--quick`` and ``--reps`` among them."""
    parser = argparse.ArgumentParser(prog=f"python -m bench {name}", description=doc)
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--reps", type=int, default=reps, help="repetitions (median reported)")
    return parser


def parse(options: argparse.ArgumentParser, argv: list[str] | None, **quick: Any) -> Any:
    """The options given; with ``--quick``, ``quick`` stands for the defaults."""
    args = options.parse_args(argv)
    if args.quick:
        options.set_defaults(**quick)
        args = options.parse_args(argv)
    return args


def ratios(a: list[float], b: list[float]) -> list[float]:
    """Each repetition's own ratio ``a / b`` (runs of the same repetition)."""
    return [x / y for x, y in zip(a, b, strict=True)]


def paired(a: list[float], b: list[float]) -> float:
    """The median of :func:`ratios`: slow drift of a shared machine moves both sides alike."""
    return statistics.median(ratios(a, b))


def configure(dbname: str, pgqueue: dict[str, Any]) -> None:
    """Django settings for the bench database (once per process)."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    settings.configure(
        INSTALLED_APPS=["django_pgqueue", "bench.benchapp"],
        DATABASES={"default": django_database(dsn_for(SERVER_DSN, dbname))},
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        # bench.benchapp's django.tasks task names its own queue: any queue is valid here.
        TASKS={"default": {"BACKEND": "django_pgqueue.tasks.PgQueueBackend", "QUEUES": []}},
        PGQUEUE=pgqueue,
    )
    django.setup()


@contextmanager
def migrated_database(dbname: str, pgqueue: dict[str, Any]) -> Iterator[None]:
    """A scratch database for the run, Django set up on it and migrated; dropped at the end."""
    with scratch_database(SERVER_DSN, dbname):
        configure(dbname, pgqueue)
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


# The claim index's predicate (attempts < max_attempts) is in the WHERE clause so the index
# serves it, as a raw queue's own index would.
RAW_CLAIM = (
    "DELETE FROM pgqueue_message WHERE id IN ("
    " SELECT id FROM pgqueue_message WHERE queue = %s AND available_at <= now()"
    " AND attempts < max_attempts"
    " ORDER BY priority DESC, available_at, id LIMIT %s FOR UPDATE SKIP LOCKED)"
    " RETURNING id"
)


def claim_batch(queue: str, batch: int, *, raw: bool, work_ms: float = 0) -> int:
    """One claim of up to ``batch`` messages, how many it got: the raw-SQL reference
    (``DELETE ... FOR UPDATE SKIP LOCKED``), or ``Message.objects.lease`` + ``complete``
    after ``work_ms`` of work per message."""
    if raw:
        return len(execute(RAW_CLAIM, [queue, batch]))
    from django_pgqueue.core import transitions
    from django_pgqueue.models import Message

    leased = Message.objects.lease(queue, worker_id=f"bench-{os.getpid()}", batch_size=batch)
    if leased:
        if work_ms:
            time.sleep(work_ms * len(leased) / 1000)
        transitions.complete(leased)
    return len(leased)


@contextmanager
def running_worker(**options: Any) -> Iterator[Worker]:
    """A worker as ``pgq_worker`` runs it (``WorkerOptions(**options)``, no signal handlers),
    in a thread of this process for the block; asked to stop and joined at its end."""
    from django.db import connections

    from django_pgqueue.worker.runner import Worker, WorkerOptions

    connections.close_all()
    worker = Worker(WorkerOptions(install_signal_handlers=False, **options))
    running = threading.Thread(target=worker.run)
    running.start()
    try:
        yield worker
    finally:
        worker.request_stop()
        running.join()
        connections.close_all()
