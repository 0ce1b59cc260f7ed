"""Pipeline bench: export and bulk enqueue through Spark, side by side with raw references::

    python -m bench pipeline [--rows 500000] [--enqueue-rows 200000] [--repeat 3]

It creates (and drops afterwards) the database ``pgq_pipeline_bench`` on ``BENCH_SERVER_DSN``,
fills the archive with ``--rows`` rows (queue x day spread, ~190-byte JSON payloads), then
measures in one run:

- export: ``pgq_pipeline export`` to a local directory (one Spark task per id range: psycopg
  ``COPY`` -> pyarrow -> Parquet partitioned by queue/day, PostgreSQL checksum in the read's
  snapshot, ids read back) vs one process doing psycopg ``COPY`` -> pyarrow -> partitioned
  Parquet (no verification);
- bulk enqueue: ``enqueue_frame`` of a cached DataFrame (validating pass, then per partition
  dedup, history check, ``COPY`` and NOTIFY) vs one psycopg ``COPY`` of the same prepared rows
  into ``pgqueue_message``.

``--repeat`` repetitions run interleaved (the side that goes first alternates); the table
gives the median rate and the median (min-max) of the per-repetition ratios. Python workers
are started and have imported pyarrow and psycopg before timing, as the reference process has.

Peak memory is the sampled RSS sum of this process and its children (the JVM, Python
workers). Spark start-up is reported apart and excluded from the rates.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import psycopg

from .context import REPO_DIR
from .pg import SERVER_DSN, dsn_url, scratch_database
from .report import table

DB_NAME = "pgq_pipeline_bench"


def django_env(dsn: str) -> dict[str, str]:
    """The environment of a process of this checkout on the bench database (test settings)."""
    return {
        "DATABASE_URL": dsn_url(dsn),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join([str(REPO_DIR), str(REPO_DIR / "example_project")]),
    }


class PeakRss:
    """Samples the RSS of this process tree every 50 ms."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for process in [me, *me.children(recursive=True)]:
                try:
                    total += process.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.05)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def timed(
    results: list[dict[str, Any]], name: str, rows: int, ref: str | None, rep: int = 0
) -> Iterator[None]:
    with PeakRss() as rss:
        started = time.perf_counter()
        yield
        seconds = time.perf_counter() - started
    results.append(
        {
            "name": name,
            "rows": rows,
            "seconds": seconds,
            "peak_mib": rss.peak / 2**20,
            "ref": ref,
            "rep": rep,
        }
    )
    print(f"  {name}: {rows / seconds:,.0f} rows/s ({seconds:.2f} s)", file=sys.stderr)


def setup_django(dsn: str) -> None:
    env = django_env(dsn)
    os.environ.update(DATABASE_URL=env["DATABASE_URL"])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", env["DJANGO_SETTINGS_MODULE"])
    sys.path[:0] = env["PYTHONPATH"].split(os.pathsep)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def fill_archive(conn: psycopg.Connection[Any], rows: int) -> None:
    conn.execute(
        """
        INSERT INTO pgqueue_archive
            (message_id, queue, task, payload, enqueued_at, attempts, errors, started_at,
             finished_at, worker_id)
        SELECT i, 'queue_' || i %% 8, 'app.tasks.task_' || i %% 40,
               jsonb_build_object('user_id', i, 'email', md5(i::text) || '@example.com',
                                  'items', jsonb_build_array(i %% 7, i %% 11, i %% 13),
                                  'note', md5(i::text) || md5((i + 1)::text)),
               ts, 1, '[]'::jsonb, ts + interval '1 second', ts + interval '2 seconds', 'w1'
        FROM generate_series(1, %s) AS i,
             LATERAL (SELECT timestamptz '2026-10-01' + i * interval '1300 ms') AS t(ts)
        """,
        [rows],
    )
    conn.execute("VACUUM ANALYZE pgqueue_archive")


def baseline_export(dsn: str, out: Path, chunk: int = 100_000) -> int:
    """psycopg COPY (CSV) -> pyarrow -> Parquet partitioned queue/day, one process."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.dataset as ds

    columns = (
        "id, message_id, queue, task, payload::text, priority, tenant, dedup_key, "
        "(extract(epoch FROM enqueued_at) * 1000000)::bigint, attempts, max_attempts, "
        "errors::text, (extract(epoch FROM started_at) * 1000000)::bigint, "
        "(extract(epoch FROM finished_at) * 1000000)::bigint, worker_id, result::text"
    )
    names = [
        "id", "message_id", "queue", "task", "payload", "priority", "tenant", "dedup_key",
        "enqueued_at", "attempts", "max_attempts", "errors", "started_at", "finished_at",
        "worker_id", "result",
    ]  # fmt: skip
    string_columns = {"queue", "task", "payload", "tenant", "dedup_key", "errors", "worker_id"}
    convert = pacsv.ConvertOptions(
        column_types={n: pa.string() for n in string_columns | {"result"}}
    )
    total = 0
    with psycopg.connect(dsn) as conn:
        low, high = conn.execute("SELECT min(id), max(id) FROM pgqueue_archive").fetchone()
        part = 0
        for lo in range(low, high + 1, chunk):
            buffer = bytearray()
            with conn.cursor().copy(
                f"COPY (SELECT {columns} FROM pgqueue_archive WHERE id >= {lo} "
                f"AND id < {lo + chunk}) TO STDOUT (FORMAT csv)"
            ) as copy:
                for data in copy:
                    buffer += data
            conn.commit()  # each chunk its own short read, like the Spark job
            table = pacsv.read_csv(
                pa.BufferReader(bytes(buffer)),
                read_options=pacsv.ReadOptions(column_names=names),
                convert_options=convert,
            )
            for name in ("enqueued_at", "started_at", "finished_at"):
                index = table.schema.get_field_index(name)
                table = table.set_column(
                    index, name, table[name].cast(pa.timestamp("us", tz="UTC"))
                )
            day = pc.strftime(table["finished_at"], format="%Y-%m-%d")
            table = table.append_column("day", day)
            ds.write_dataset(
                table,
                out,
                format="parquet",
                partitioning=["queue", "day"],
                partitioning_flavor="hive",
                basename_template=f"part-{part}-{{i}}.parquet",
                existing_data_behavior="overwrite_or_ignore",
                file_options=ds.ParquetFileFormat().make_write_options(compression="zstd"),
            )
            part += 1
            total += table.num_rows
    return total


def baseline_copy_enqueue(dsn: str, rows: list[tuple[str, str, str, str]]) -> int:
    with psycopg.connect(dsn) as conn:
        with conn.cursor().copy(
            "COPY pgqueue_message (queue, task, payload, dedup_key) FROM STDIN"
        ) as copy:
            for row in rows:
                copy.write_row(row)
        conn.execute("SELECT pg_notify('django_pgqueue', 'bench')")
    return len(rows)


EXPORT_REF = "reference: psycopg COPY -> pyarrow -> Parquet (1 process, no verification)"
EXPORT_JOB = "pgq_pipeline export (verified, resumable)"
ENQUEUE_REF = "reference: psycopg COPY into pgqueue_message (1 process)"
ENQUEUE_JOB = "pgq_pipeline enqueue (validated, deduplicated, NOTIFY per partition)"


def _pass_batches(batches: Any) -> Any:
    yield from batches


def _warm_worker(value: int) -> int:
    import numpy as np
    import psycopg  # noqa: F401
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv
    import pyarrow.dataset

    # pyarrow.compute builds its function registry on first use: do it here, not timed.
    pc.sum(pa.array(np.arange(3)))
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench pipeline", description=__doc__.split("::")[0]
    )
    parser.add_argument("--rows", type=int, default=500_000, help="Archive rows to export.")
    parser.add_argument("--enqueue-rows", type=int, default=200_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=3, help="Interleaved repetitions.")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pgq-pipeline-bench-"))
    results: list[dict[str, Any]] = []
    with scratch_database(SERVER_DSN, DB_NAME) as dsn:
        try:
            startup = run(args, dsn, work, results)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            from django.db import connections

            connections.close_all()
    print(
        f"\nSpark {args.master}, start-up {startup:.1f} s (not counted), {args.repeat} "
        "interleaved repetitions; rows/s is the median, x reference the median (min-max) of "
        "the per-repetition ratios.\n"
    )
    rows = []
    for name in dict.fromkeys(r["name"] for r in results):
        runs = [r for r in results if r["name"] == name]
        rate = statistics.median(r["rows"] / r["seconds"] for r in runs)
        ratio = ""
        if runs[0]["ref"]:
            ratios = []
            for r in runs:
                ref = next(x for x in results if x["name"] == r["ref"] and x["rep"] == r["rep"])
                ratios.append((r["rows"] / r["seconds"]) / (ref["rows"] / ref["seconds"]))
            ratio = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        peak = max(r["peak_mib"] for r in runs)
        rows.append([name, f"{runs[0]['rows']:,}", f"{rate:,.0f}", ratio, f"{peak:,.0f}"])
    print(table("job | rows | rows/s (median) | x reference | peak RSS MiB", rows))
    return 0


def run(args: argparse.Namespace, dsn: str, work: Path, results: list[dict[str, Any]]) -> float:
    """The interleaved repetitions; returns the Spark session's start-up seconds."""
    setup_django(dsn)
    from django_pgqueue.pipeline.enqueue import enqueue_frame
    from django_pgqueue.pipeline.export import export
    from django_pgqueue.pipeline.session import build_session

    with psycopg.connect(dsn, autocommit=True) as conn:
        print(f"filling {args.rows:,} archive rows", file=sys.stderr)
        fill_archive(conn, args.rows)
    started = time.perf_counter()
    spark = build_session(args.master, app_name="pgq-pipeline-bench")
    spark.range(1000).selectExpr("sum(id)").collect()  # first-job warm-up
    # Start the Python workers and import what they use, as the reference process has
    # imported pyarrow and psycopg before it is timed: both sides are measured warm.
    spark.sparkContext.parallelize(range(4), 2).map(_warm_worker).collect()
    # Spark's first Arrow job (and first barrier stage) in a session costs seconds of
    # set-up that later ones do not pay: counted with the start-up, as the session is.
    spark.range(4, numPartitions=2).mapInArrow(_pass_batches, "id long", barrier=True).collect()
    startup = time.perf_counter() - started
    print(f"Spark session ready in {startup:.1f} s", file=sys.stderr)

    n = args.enqueue_rows
    frame = spark.range(n, numPartitions=2).selectExpr(
        "id AS user_id", "concat(md5(cast(id AS string)), '@example.com') AS email",
        "array(id % 7, id % 11, id % 13) AS items",
        "concat(md5(cast(id AS string)), md5(cast(id + 1 AS string))) AS note",
    ).cache()  # fmt: skip
    frame.count()
    prepared = [
        ("bench", "bench.noop", row[0], f"copy:{i}")
        for i, row in enumerate(frame.selectExpr("to_json(struct(*))").toLocalIterator())
    ]

    def truncate() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE pgqueue_message")

    def run_export_reference(rep: int) -> None:
        with timed(results, EXPORT_REF, args.rows, None, rep):
            baseline_export(dsn, work / f"baseline-{rep}")

    def run_export(rep: int) -> None:
        with timed(results, EXPORT_JOB, args.rows, EXPORT_REF, rep):
            exported = export(spark, str(work / f"spark-{rep}"), master=args.master)
        assert exported.rows_exported == args.rows and not exported.mismatched, exported

    def run_enqueue_reference(rep: int) -> None:
        with timed(results, ENQUEUE_REF, n, None, rep):
            baseline_copy_enqueue(dsn, prepared)
        truncate()

    def run_enqueue(rep: int) -> None:
        with timed(results, ENQUEUE_JOB, n, ENQUEUE_REF, rep):
            result = enqueue_frame(
                spark, frame, task="bench.noop", queue="bench", batch_id=f"b{rep}"
            )
        assert result.enqueued == n, result
        truncate()

    # Interleaved, alternating which side goes first, so load drifts on a shared machine
    # hit both sides alike; every repetition gives its own ratio.
    for rep in range(args.repeat):
        print(f"repetition {rep + 1}/{args.repeat}", file=sys.stderr)
        pairs = [(run_export_reference, run_export), (run_enqueue_reference, run_enqueue)]
        for reference, job in pairs:
            for step in (reference, job) if rep % 2 == 0 else (job, reference):
                step(rep)
    spark.stop()
    return startup
