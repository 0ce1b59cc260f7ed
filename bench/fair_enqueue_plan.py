"""Single ``enqueue()`` calls into a fair queue, in autocommit, after the statement was
planned on an empty table and on a large analyzed one (see docs/benchmarks.md)::

    .venv/bin/python bench/fair_enqueue_plan.py [--n 2000]

Run it from two checkouts one after the other to compare them. Creates and drops its own
database (``pgq_fair_enqueue_bench``) on ``BENCH_SERVER_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pg import scratch_database

SERVER_DSN = os.environ.get("BENCH_SERVER_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
DBNAME = "pgq_fair_enqueue_bench"
BACKLOG = 100_000
LOAD = (
    "INSERT INTO pgqueue_message (queue, task, payload, tenant, fair_order) "
    "SELECT 'fq', 't', '{}'::jsonb, 't' || (g % 50), g / 50.0 "
    f"FROM generate_series(1, {BACKLOG}) g"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="timed enqueues per case")
    args = parser.parse_args()
    with scratch_database(SERVER_DSN, DBNAME) as dsn:
        run(dsn, args.n)


def run(dsn: str, n: int) -> None:
    from django.db import connections
    from django.test.utils import override_settings

    from bench import core_cases
    from django_pgqueue import enqueue

    core_cases.setup_django(dsn)
    raw = psycopg.connect(dsn, autocommit=True)
    print(f"| statement planned on | us per fair enqueue, {BACKLOG:,} rows in the table |")
    print("|---|---:|")
    with override_settings(PGQUEUE={"QUEUES": {"fq": {"FAIRNESS": True}}}):
        for case in ("an empty table", f"{BACKLOG:,} analyzed rows"):
            connections.close_all()  # a new session: the statement is prepared anew
            raw.execute("TRUNCATE pgqueue_message")
            if case != "an empty table":
                raw.execute(LOAD)
            raw.execute("VACUUM ANALYZE pgqueue_message")
            for i in range(10):  # past the custom plans: the server settles on a plan
                enqueue("t", {"i": i}, queue="fq", tenant=f"t{i % 50}")
            if case == "an empty table":
                raw.execute(LOAD)  # the backlog arrives; no ANALYZE
            started = time.perf_counter()
            for i in range(n):
                enqueue("t", {"i": i}, queue="fq", tenant=f"t{i % 50}")
            print(f"| {case} | {(time.perf_counter() - started) / n * 1e6:,.0f} |")
    raw.close()


if __name__ == "__main__":
    main()
