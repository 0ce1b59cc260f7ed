"""The walk a claim starts with, as messages are processed behind a big backlog: claims in
spells on one backlog, and after each spell the buffers of one walk of the claim order's head
and, for a fair queue, of the head probe an enqueue makes (see docs/benchmarks.md)::

    python -m bench.head_walk [--ready 2000000] [--tenants 10000] [--spells 10] [--spell 20000]

``--tenants 0`` measures the plain queue. Until vacuum removes them, every processed message
leaves a dead entry at the head of its claim order, and each walk reads their index pages.
Creates and drops its own database (``BENCH_HEAD_WALK_DB``, default ``pgq_head_walk_bench``)
on ``BENCH_SERVER_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``); its
server's autovacuum settings decide whether vacuum runs in between.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import psycopg

from . import core_cases, raw
from .config import QUEUE
from .mvcc_scale import CLAIM_BATCH, FAIR_QUEUE, head_walk_buffers, load_ready, plan_buffers
from .pg import scratch_database

SERVER_DSN = os.environ.get("BENCH_SERVER_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
DBNAME = os.environ.get("BENCH_HEAD_WALK_DB", "pgq_head_walk_bench")

# The first probe of a fair enqueue's place (sql.FAIR_ORDER_ENTRY): the head of the order.
ENQUEUE_HEAD_PROBE = (
    "SELECT h.fair_order FROM pgqueue_message h WHERE h.queue = %s AND h.priority = 0 "
    "AND h.fair_order >= 0 ORDER BY h.fair_order LIMIT 1"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ready", type=int, default=2_000_000)
    parser.add_argument("--tenants", type=int, default=10_000, help="0: the plain queue")
    parser.add_argument("--spells", type=int, default=10)
    parser.add_argument("--spell", type=int, default=20_000, help="messages claimed per spell")
    args = parser.parse_args()
    with scratch_database(SERVER_DSN, DBNAME) as dsn:
        run(dsn, args.ready, args.tenants, args.spells, args.spell)


def run(dsn: str, ready: int, tenants: int, spells: int, spell: int) -> None:
    core_cases.setup_django(dsn)
    fair = tenants > 0
    queue = FAIR_QUEUE if fair else QUEUE
    with raw.connect(dsn) as conn:
        load_ready(conn, ready, tenants)
        conn.execute("VACUUM ANALYZE pgqueue_message")
        kind = f"fair, {tenants:,} tenants" if fair else "plain"
        print(f"{ready:,} ready ({kind}), claimed in batches of {CLAIM_BATCH}")
        print()
        print(
            "| claimed so far | claim+complete/s over the spell | head walk buffers"
            " | enqueue head probe buffers |"
        )
        print("|--:|--:|--:|--:|")
        _row(conn, queue, fair, 0, None)
        claimed = 0
        for _ in range(spells):
            core_cases.warm_up()
            t0 = time.perf_counter()
            done = core_cases.lease_complete_drain(CLAIM_BATCH, limit=spell, queue=queue)
            rate = done / (time.perf_counter() - t0)
            claimed += done
            _row(conn, queue, fair, claimed, rate)
            if done < spell:
                break


def _row(
    conn: psycopg.Connection[Any], queue: str, fair: bool, claimed: int, rate: float | None
) -> None:
    probe = f"{plan_buffers(conn, ENQUEUE_HEAD_PROBE, [queue]):,}" if fair else "-"
    walk = head_walk_buffers(conn, queue, fair)
    shown = "-" if rate is None else f"{rate:,.0f}"
    print(f"| {claimed:,} | {shown} | {walk:,} | {probe} |", flush=True)


if __name__ == "__main__":
    main()
