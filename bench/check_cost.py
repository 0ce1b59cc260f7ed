"""What a queue-name CHECK costs a claim and an archive write (see docs/benchmarks.md).

Copies of the live and archive tables (``CREATE TABLE ... (LIKE ... INCLUDING ALL)``), each
with one form of the queue-name CHECK, the claim's UPDATE and the archive's INSERT of 100
rows timed by ``EXPLAIN ANALYZE`` (server time only), the forms in alternation::

    .venv/bin/python bench/check_cost.py [--rounds 150]

Creates and drops its own database (``pgq_check_bench``) on ``BENCH_SERVER_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pg import scratch_database

SERVER_DSN = os.environ.get("BENCH_SERVER_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
DBNAME = "pgq_check_bench"
ALLOWED = "abcdefghijklmnopqrstuvwxyz0123456789_-"
FORMS = {
    "regular expression": "queue::text ~ '^[a-z0-9][a-z0-9_-]{0,47}$'",
    "ltrim (migration 0008)": (
        f"NOT (queue = '') AND ltrim(queue, '{ALLOWED}') = '' AND NOT (left(queue, 1) IN ('_', '-'))"
    ),
    "none": None,
}
CLAIM = """
WITH c AS (SELECT id FROM {t} WHERE queue = 'bench' AND available_at <= now()
                                AND attempts < max_attempts
           ORDER BY priority DESC, available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED)
UPDATE {t} q SET attempts = q.attempts + 1, lease_token = gen_random_uuid(), leased_by = 'w1',
                 leased_at = now(), available_at = now() + interval '30 seconds'
FROM c WHERE q.id = c.id"""
COLUMNS = "queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts"
ARCHIVE = f"""
INSERT INTO {{t}} (id, message_id, {COLUMNS}, started_at, finished_at, worker_id)
SELECT id + {{offset}}, id + {{offset}}, {COLUMNS}, leased_at, now(), leased_by
FROM pgqueue_message WHERE id <= 100"""


def server_ms(conn: psycopg.Connection[Any], statement: str) -> float:
    """Server time of ``statement``, rolled back: every round starts from the same rows."""
    with conn.transaction(force_rollback=True):
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement).fetchone()
    assert row is not None
    return float(row[0][0]["Execution Time"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150)
    args = parser.parse_args()
    with scratch_database(SERVER_DSN, DBNAME) as dsn:
        run(dsn, args.rounds)


def run(dsn: str, rounds: int) -> None:
    from bench import core_cases

    core_cases.setup_django(dsn)
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET enable_seqscan = off; SET jit = off")
    rows = [("bench", "bench.noop", json.dumps({"i": i, "pad": "x" * 64})) for i in range(20_000)]
    for n, check in enumerate(FORMS.values()):
        for kind, source in (("live", "pgqueue_message"), ("archive", "pgqueue_archive")):
            table = f"check_{kind}_{n}"
            conn.execute(f"CREATE TABLE {table} (LIKE {source} INCLUDING ALL)")
            for (constraint,) in conn.execute(
                "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass "
                "AND contype = 'c' AND conname LIKE '%%queue_name%%'",
                [table],
            ).fetchall():
                conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {constraint}")
            if check:
                conn.execute(f"ALTER TABLE {table} ADD CHECK ({check})")
        with (
            conn.cursor() as cur,
            cur.copy(f"COPY check_live_{n} (queue, task, payload) FROM STDIN") as copy,
        ):
            for row in rows:
                copy.write_row(row)
        conn.execute(f"VACUUM ANALYZE check_live_{n}")
    with (
        conn.cursor() as cur,
        cur.copy(
            "COPY pgqueue_message (queue, task, payload, leased_by, leased_at) FROM STDIN"
        ) as copy,
    ):
        for row in rows[:100]:
            copy.write_row((*row, "w1", "2026-01-01T00:00:00Z"))
    claim: dict[str, list[float]] = {name: [] for name in FORMS}
    archive: dict[str, list[float]] = {name: [] for name in FORMS}
    for r in range(rounds):
        for n, name in enumerate(FORMS):
            claim[name].append(server_ms(conn, CLAIM.format(t=f"check_live_{n}")))
            statement = ARCHIVE.format(t=f"check_archive_{n}", offset=r * 1000)
            archive[name].append(server_ms(conn, statement))
    print("| queue-name CHECK | claim UPDATE, 100 rows (ms) | archive INSERT, 100 rows (ms) |")
    print("|---|---:|---:|")
    for name in FORMS:
        print(
            f"| {name} | {statistics.median(claim[name]):.3f} | "
            f"{statistics.median(archive[name]):.3f} |"
        )
    print(f"\nServer time (EXPLAIN ANALYZE), median of {rounds} rounds, forms alternating.")
    conn.close()


if __name__ == "__main__":
    main()
