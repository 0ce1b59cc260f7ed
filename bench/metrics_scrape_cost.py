"""What one scrape of the queue gauges costs the database, at 1,000,000 live rows.

Fills a scratch database with ``--rows`` live messages (one big queue: ready, scheduled and
leased; a few small queues), as many dead rows and half as many archived ones, then runs
every statement of a scrape (``metrics/queues.py``: the queue list, the gauges, the totals)
under ``EXPLAIN (ANALYZE, BUFFERS)``, beside what exact ``COUNT(*)`` gauges would cost. Twice:
before the first vacuum (no visibility map: index-only scans visit the heap) and after
``VACUUM ANALYZE``::

    .venv/bin/python bench/metrics_scrape_cost.py [--rows 1000000] [--dbname pgq_metrics_bench]

Prints a markdown table: server execution time (best of ``--repeat``) and shared buffers
(hit + read) per statement. Creates and drops its database on ``BENCH_SERVER_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.pg import django_database, scratch_database  # noqa: E402

SERVER_DSN = os.environ.get("BENCH_SERVER_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")

# Exact counts, the way a naive exporter would read the same gauges.
EXACT_SQL = """
SELECT queue,
       count(*) FILTER (WHERE available_at <= now() AND attempts < max_attempts),
       count(*) FILTER (WHERE available_at > now() AND lease_token IS NULL),
       count(*) FILTER (WHERE available_at > now() AND lease_token IS NOT NULL),
       extract(epoch FROM now() - min(available_at) FILTER (WHERE available_at <= now()))
FROM pgqueue_message GROUP BY queue
"""
EXACT_DEAD_SQL = "SELECT queue, count(*) FROM pgqueue_dead GROUP BY queue"


def setup_django(dsn: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django_pgqueue"],
        DATABASES={"default": django_database(dsn)},
        USE_TZ=True,
    )
    django.setup()


def fill(rows: int) -> None:
    from django.db import connection

    big = rows - 3_000
    ready, scheduled = int(big * 0.7), int(big * 0.2)
    leased = big - ready - scheduled
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pgqueue_message (queue, task, payload, available_at)
            SELECT 'big', 'bench.noop', '{}', now() - make_interval(secs => g)
            FROM generate_series(1, %(ready)s) g;
            INSERT INTO pgqueue_message (queue, task, payload, available_at)
            SELECT 'big', 'bench.noop', '{}', now() + make_interval(secs => 3600 + g)
            FROM generate_series(1, %(scheduled)s) g;
            INSERT INTO pgqueue_message
                (queue, task, payload, available_at, lease_token, leased_by, leased_at, attempts)
            SELECT 'big', 'bench.noop', '{}', now() + interval '5 minutes',
                   gen_random_uuid(), 'bench', now(), 1
            FROM generate_series(1, %(leased)s) g;
            INSERT INTO pgqueue_message (queue, task, payload, available_at)
            SELECT 'small-' || (g %% 3), 'bench.noop', '{}', now() - interval '1 second'
            FROM generate_series(1, 3000) g;
            INSERT INTO pgqueue_dead (message_id, queue, task, payload, reason, errors, details)
            SELECT g, CASE WHEN g %% 100 = 0 THEN 'small-0' ELSE 'big' END, 'bench.noop',
                   '{}', 'error', '[]', '{}'
            FROM generate_series(1, %(rows)s) g;
            INSERT INTO pgqueue_archive (message_id, queue, task, payload, finished_at)
            SELECT %(rows)s + g, 'big', 'bench.noop', '{}', now() - make_interval(secs => g)
            FROM generate_series(1, %(rows)s / 2) g;
            """,
            {"ready": ready, "scheduled": scheduled, "leased": leased, "rows": rows},
        )


def explain(statement: str, params: Any) -> tuple[float, int]:
    """(execution ms, shared buffers hit + read) of one run of ``statement``; TIMING OFF, as
    timing every row would cost more than these short index walks themselves."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET jit = off")
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {statement}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    top = plan[0]
    node = top["Plan"]
    return top["Execution Time"], node.get("Shared Hit Blocks", 0) + node.get(
        "Shared Read Blocks", 0
    )


def round_trip(statement: str, params: Any) -> float:
    """Milliseconds the client waits for ``statement`` and its rows, without EXPLAIN."""
    from django.db import connection

    with connection.cursor() as cursor:
        started = time.perf_counter()
        cursor.execute(statement, params)
        cursor.fetchall()
        return (time.perf_counter() - started) * 1000


def gauges_plan() -> str:
    from django.db import connection

    _, statement, params = statements()[1]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {statement}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def statements() -> list[tuple[str, str, Any]]:
    from django_pgqueue.counts import COUNT_CAP, QUEUES_SQL, SAMPLE_CAP, live_worker_seconds
    from django_pgqueue.metrics.queues import GAUGES_SQL, TOTALS_SQL, known_queues

    queues = [name for name, _ in known_queues()]
    window = {"live_window": live_worker_seconds()}
    return [
        ("scrape: queue list", QUEUES_SQL, window),
        (
            "scrape: gauges",
            GAUGES_SQL,
            {"queues": queues, "cap": COUNT_CAP, "sample": SAMPLE_CAP},
        ),
        ("scrape: workers, estimates", TOTALS_SQL, window),
        ("exact COUNT(*): live", EXACT_SQL, None),
        ("exact COUNT(*): dead", EXACT_DEAD_SQL, None),
    ]


def measure(repeat: int) -> dict[str, tuple[float, int, float]]:
    """Per statement: best execution ms (EXPLAIN), buffers, best client round trip ms."""
    results = {}
    for name, statement, params in statements():
        runs = [explain(statement, params) for _ in range(repeat)]
        trips = [round_trip(statement, params) for _ in range(repeat)]
        results[name] = (min(ms for ms, _ in runs), runs[-1][1], min(trips))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dbname", default="pgq_metrics_bench")
    parser.add_argument(
        "--show-plan", action="store_true", help="also print the gauges' plan after vacuum"
    )
    args = parser.parse_args()
    with scratch_database(SERVER_DSN, args.dbname) as dsn:
        setup_django(dsn)
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", "django_pgqueue", verbosity=0)
        fill(args.rows)
        before = measure(args.repeat)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE pgqueue_message, pgqueue_dead, pgqueue_archive")
        after = measure(args.repeat)
        if args.show_plan:
            print(gauges_plan())
        connection.close()
    print(
        f"Scrape cost at {args.rows:,} live rows, {args.rows:,} dead, {args.rows // 2:,} archived"
    )
    print(
        f"(best of {args.repeat}: server execution ms from EXPLAIN (ANALYZE, BUFFERS, TIMING "
        "OFF), shared buffers hit + read, client round trip ms of the plain statement)\n"
    )
    print("| statement | phase | execution ms | buffers | round trip ms |")
    print("|---|---|---:|---:|---:|")
    for label, data in (("before vacuum", before), ("after VACUUM ANALYZE", after)):
        for name, (ms, buffers, trip) in data.items():
            print(f"| {name} | {label} | {ms:.1f} | {buffers:,} | {trip:.1f} |")
    for label, data in (("before vacuum", before), ("after VACUUM ANALYZE", after)):
        scrape = sum(v[2] for k, v in data.items() if k.startswith("scrape"))
        exact = sum(v[2] for k, v in data.items() if k.startswith("exact"))
        print(
            f"\n{label}: one scrape {scrape:.1f} ms round trip, exact COUNT(*) gauges "
            f"{exact:.1f} ms (ratio {exact / scrape if scrape else float('nan'):.0f}x)"
        )


if __name__ == "__main__":
    main()
