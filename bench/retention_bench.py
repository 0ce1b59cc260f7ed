"""What expiring one day of the archive costs: a partition drop against a batched DELETE.

Both through ``core._retention.run_retention()``, on the same shape of day (``--rows`` archived
rows, default 1,000,000, finished ten and nine days ago): the drop is what retention does when
the day is older than every queue's retention; the batched DELETE is what it does for a queue
whose retention is shorter than another's (``RETENTION_DELETE_BATCH`` rows per transaction).
Meanwhile one drain process leases and completes a backlog (``lease()`` + ``complete()``, the
worker's two statements), so the table also shows what each expiry does to a draining queue::

    .venv/bin/python bench/retention_bench.py [--rows 1000000] [--dbname pgq_retention_bench]

Prints one markdown table: seconds, WAL bytes (``pg_current_wal_lsn()`` difference; it is
cluster-wide, so other sessions on the server add to it: the rate they wrote at in the two
idle seconds just before is shown beside it), the archive's ``n_dead_tup`` after (all its
partitions), and the drain rate during the expiry against the same process's rate just
before it (over at least one second). Uses a scratch database it drops at the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.pg import django_database, dsn_for, scratch_database  # noqa: E402

SERVER_DSN = os.environ.get("BENCH_SERVER_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
QUEUE = "drain"
BATCH = 100
WINDOW = 1.0  # shortest window a drain rate is taken over, in seconds


def setup_django(dbname: str) -> None:
    import django
    from django.conf import settings

    if settings.configured:
        return
    settings.configure(
        INSTALLED_APPS=["django_pgqueue"],
        DATABASES={"default": django_database(dsn_for(SERVER_DSN, dbname))},
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        PGQUEUE={"NOTIFY": False, "RETENTION_INTERVAL": None},
    )
    django.setup()


def _drain(dbname: str, stop: Any, running: Any, done: Any) -> None:
    """Lease and complete batches while ``running`` until told to stop; ``done`` logs
    (monotonic, count)."""
    setup_django(dbname)
    from django_pgqueue.core import transitions
    from django_pgqueue.models import Message

    while not stop.is_set():
        if not running.wait(0.1):
            continue
        leased = Message.objects.lease(QUEUE, worker_id="drain", batch_size=BATCH)
        if not leased:
            time.sleep(0.01)
            continue
        transitions.complete(leased)
        done.put((time.monotonic(), len(leased)))


class Drain:
    def __init__(self, dbname: str) -> None:
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self.running = ctx.Event()
        self.done: Any = ctx.Queue()
        self.events: list[tuple[float, int]] = []
        self.proc = ctx.Process(
            target=_drain, args=(dbname, self.stop, self.running, self.done), daemon=True
        )

    def __enter__(self) -> Drain:
        self.proc.start()
        return self

    def collect(self) -> None:
        while not self.done.empty():
            self.events.append(self.done.get())

    def rate(self, start: float, end: float) -> float:
        self.collect()
        end = max(end, start + WINDOW)
        return sum(n for t, n in self.events if start <= t < end) / (end - start)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.proc.join(10)


def fill_day(cursor: Any, partition: Any, rows: int) -> None:
    from django.db import connection

    from django_pgqueue.core import _partitions

    _partitions.ensure_days(connection, partition.day, partition.day)
    # A payload and result of a few dozen bytes each, like a small task's.
    cursor.execute(
        """
        INSERT INTO pgqueue_archive
            (message_id, queue, task, payload, enqueued_at, attempts, started_at, finished_at,
             worker_id, result)
        SELECT g, 'q' || (g %% 20), 'app.tasks.work', jsonb_build_object('user', g, 'op', 'sync'),
               t, 1, t, t, 'host:1234:abcdef', jsonb_build_object('ok', true)
        FROM generate_series(1, %s) g,
             LATERAL (SELECT %s::timestamptz + g * (interval '86399 seconds' / %s)) AS x(t)
        """,
        [rows, partition.start, rows],
    )
    cursor.execute(f"VACUUM (ANALYZE) {partition.name}")


def dead_tuples(cursor: Any) -> int:
    time.sleep(1.0)  # backends publish their counters about once a second
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    cursor.execute(
        "SELECT coalesce(sum(s.n_dead_tup), 0) FROM pg_stat_user_tables s "
        "JOIN pg_inherits i ON i.inhrelid = s.relid WHERE i.inhparent = 'pgqueue_archive'::regclass"
    )
    return int(cursor.fetchone()[0])


def expire(
    settings: dict[str, Any], drain: Drain, cursor: Any
) -> tuple[float, int, float, int, float, float]:
    """One expiry: (seconds, WAL bytes, other sessions' WAL bytes/s just before, archive
    n_dead_tup after, drain msg/s during, before)."""
    from django.test.utils import override_settings

    from django_pgqueue.core._retention import run_retention

    cursor.execute("CHECKPOINT")
    # What the rest of the server writes meanwhile (the LSN is cluster-wide): this process
    # is idle for 2 s, so those bytes are other sessions' (the drain's, when it runs).
    cursor.execute("SELECT pg_current_wal_lsn()")
    idle_lsn = cursor.fetchone()[0]
    time.sleep(2 * WINDOW)
    cursor.execute("SELECT pg_current_wal_lsn(), pg_current_wal_lsn() - %s::pg_lsn", [idle_lsn])
    lsn, idle_wal = cursor.fetchone()
    started = time.monotonic()
    with override_settings(PGQUEUE={"NOTIFY": False, "RETENTION_INTERVAL": None, **settings}):
        report = run_retention(sources=("archive",))
    ended = time.monotonic()
    cursor.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", [lsn])
    wal = int(cursor.fetchone()[0])
    assert [s for s in report.steps if s.action in ("drop", "delete")], report.lines()
    return (
        ended - started,
        wal,
        int(idle_wal) / (2 * WINDOW),
        dead_tuples(cursor),
        drain.rate(started, ended),
        drain.rate(started - 2 * WINDOW, started),
    )


def day(today: dt.date, days_ago: int) -> Any:
    from django_pgqueue.core import _partitions

    past = today - dt.timedelta(days=days_ago)
    return _partitions.Partition(_partitions.partition_name(past), past)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dbname", default="pgq_retention_bench")
    args = parser.parse_args()
    with scratch_database(SERVER_DSN, args.dbname):
        setup_django(args.dbname)
        from django.core.management import call_command
        from django.db import connection

        import django_pgqueue
        from django_pgqueue.core import _partitions

        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            today = _partitions.today(cursor)
            # The drain's backlog.
            for _ in range(20):
                django_pgqueue.enqueue_many("bench.noop", [{}] * 20_000, queue=QUEUE)
            cursor.execute("VACUUM (ANALYZE) pgqueue_message")
            # Every day older than a week goes whole.
            drop = {"ARCHIVE_RETENTION": 7 * 86400.0}
            # No whole-day drop (a queue keeps its rows forever): the day's 20 queues' week
            # of retention deletes their rows in batches, the same rows.
            delete = {
                "ARCHIVE_RETENTION": None,
                "QUEUES": {f"q{n}": {"ARCHIVE_RETENTION": 7 * 86400.0} for n in range(20)},
                "RETENTION_DELETE_LIMIT": 10 * args.rows,
            }
            results: dict[str, list[Any]] = {}
            with Drain(args.dbname) as drain:
                # Quiet: the expiry's own time and WAL. Then again while a queue drains.
                for ago, (label, settings) in enumerate(
                    [("partition drop", drop), ("batched DELETE", delete)] * 2, start=10
                ):
                    if ago == 12:
                        drain.running.set()
                    fill_day(cursor, day(today, ago), args.rows)
                    results.setdefault(label, []).append(expire(settings, drain, cursor))
    print(f"Expire one day of {args.rows:,} archived rows (core._retention.run_retention)\n")
    print(
        "| how | seconds | WAL bytes | other sessions' WAL bytes/s | archive n_dead_tup after "
        "| seconds while draining | drain msg/s during | drain msg/s just before |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, (quiet, busy) in results.items():
        seconds, wal, noise, dead, _, _ = quiet
        loaded, _, _, _, during, before = busy
        print(
            f"| {label} | {seconds:.3f} | {wal:,} | {noise:,.0f} | {dead:,} | {loaded:.3f} "
            f"| {during:,.0f} | {before:,.0f} |"
        )


if __name__ == "__main__":
    main()
