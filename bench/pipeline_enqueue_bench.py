"""Bulk enqueue bench: ``enqueue_frame`` side by side with a raw ``COPY`` of the same rows.

Run from the repository root:

    .venv/bin/python bench/pipeline_enqueue_bench.py --rows 200000 --repeat 3

It creates (and drops afterwards) the database ``pgq_enqueue_bench`` and measures, in
interleaved repetitions (the side that goes first alternates):

- reference: one psycopg ``COPY`` into ``pgqueue_message`` of the same rows the job writes,
  prepared beforehand (queue, task, payload JSON text, the job's dedup key), then one NOTIFY:
  no reading, no encoding, no validation;
- ``enqueue_frame`` of a cached DataFrame with the same content (JSON built by Spark,
  validation, content-hash dedup keys, history check, per-partition ``COPY`` + NOTIFY), in
  its default all-or-nothing mode, and with ``skip_bad=True``.

Spark start-up and the first Arrow job are paid before timing; the table gives the median
rate and the median (min-max) of the per-repetition ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import pipeline_bench

DB_NAME = "pgq_enqueue_bench"
REFERENCE = "reference: psycopg COPY of the prepared rows into pgqueue_message (1 process)"
JOB = "enqueue_frame, all-or-nothing (default)"
JOB_SKIP = "enqueue_frame, skip_bad=True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--server-dsn",
        default=os.environ.get("BENCH_SERVER_DSN", "postgres://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    server = args.server_dsn
    pipeline_bench.DB_NAME = DB_NAME
    dsn = make_conninfo(server, dbname=DB_NAME)
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB_NAME}")
    results: list[dict[str, Any]] = []
    try:
        pipeline_bench.setup_django(dsn)
        from django_pgqueue.pipeline.enqueue import _prepare, enqueue_frame
        from django_pgqueue.pipeline.session import build_session

        started = time.perf_counter()
        spark = build_session(args.master, app_name="pgq-enqueue-bench")
        spark.range(1000).selectExpr("sum(id)").collect()
        spark.sparkContext.parallelize(range(4), 2).map(pipeline_bench._warm_worker).collect()
        warm = spark.range(4, numPartitions=2)
        warm.mapInArrow(pipeline_bench._pass_batches, "id long", barrier=True).collect()
        startup = time.perf_counter() - started
        print(f"Spark session ready in {startup:.1f} s", file=sys.stderr)

        n = args.rows
        frame = spark.range(n, numPartitions=args.partitions).selectExpr(
            "id AS user_id", "concat(md5(cast(id AS string)), '@example.com') AS email",
            "array(id % 7, id % 11, id % 13) AS items",
            "concat(md5(cast(id AS string)), md5(cast(id + 1 AS string))) AS note",
        ).cache()  # fmt: skip
        frame.count()
        # The rows the job writes: its payload JSON and its dedup keys (a content hash each).
        rows, _, _ = _prepare(
            frame, batch_id="b0", payload_column=None, dedup_key_column=None,
            priority_column=None, tenant_column=None, drop_mapped_columns=False,
        )  # fmt: skip
        prepared = [
            ("bench", "bench.noop", row[0], row[1])
            for row in rows.select("payload", "dedup_key").toLocalIterator()
        ]
        # One untimed call: the first enqueue of a session pays for Spark's Arrow path.
        enqueue_frame(spark, frame.limit(1000), task="bench.noop", queue="warm")
        pipeline_bench.truncate(dsn)

        def reference(rep: int) -> None:
            with pipeline_bench.timed(results, REFERENCE, n, None, rep):
                pipeline_bench.baseline_copy_enqueue(dsn, prepared)
            pipeline_bench.truncate(dsn)

        def job(rep: int, skip_bad: bool = False) -> None:
            name = JOB_SKIP if skip_bad else JOB
            with pipeline_bench.timed(results, name, n, REFERENCE, rep):
                result = enqueue_frame(
                    spark, frame, task="bench.noop", queue="bench", batch_id=f"b{rep}",
                    skip_bad=skip_bad,
                )  # fmt: skip
            assert result.enqueued == n, result
            pipeline_bench.truncate(dsn)

        for rep in range(args.repeat):
            print(f"repetition {rep + 1}/{args.repeat}", file=sys.stderr)
            steps = [reference, job, lambda r: job(r, skip_bad=True)]
            for step in steps if rep % 2 == 0 else reversed(steps):
                step(rep)
        spark.stop()
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    print(
        f"\nSpark {args.master}, {args.partitions} partitions, start-up {startup:.1f} s (not "
        f"counted), {args.repeat} interleaved repetitions; rows/s is the median, x reference "
        "the median (min-max) of the per-repetition ratios.\n"
    )
    print("| job | rows | rows/s (median) | x reference | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|")
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
        print(f"| {name} | {runs[0]['rows']:,} | {rate:,.0f} | {ratio} | {peak:,.0f} |")


if __name__ == "__main__":
    main()
