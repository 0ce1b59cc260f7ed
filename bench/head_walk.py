"""The walk a claim starts with, as messages are processed behind a big backlog: claims in
spells on one backlog, and after each spell the buffers of one walk of the claim order's head,
for a fair queue those of the walk from the claimer's bounds that its claims make
(``pgq_flow_head``) and of the place a fair enqueue computes (see docs/benchmarks.md)::

    python -m bench.head_walk [--ready 2000000] [--tenants 10000] [--spells 10] [--spell 20000]

``--tenants 0`` measures the plain queue. Until vacuum removes them, every processed message
leaves a dead entry at the head of its claim order, and each walk from the head reads their
index pages. Creates and drops its own database (``BENCH_HEAD_WALK_DB``, default
``pgq_head_walk_bench``) on ``BENCH_SERVER_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``); its server's autovacuum settings decide
whether vacuum runs in between.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING, Any

import psycopg

from . import core_cases, raw
from .config import QUEUE
from .mvcc_scale import CLAIM_BATCH, FAIR_QUEUE, head_walk_buffers, load_ready, plan_buffers
from .pg import scratch_database

if TYPE_CHECKING:
    from django_pgqueue.core._claim_bound import ClaimBounds

SERVER_DSN = os.environ.get("BENCH_SERVER_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
DBNAME = os.environ.get("BENCH_HEAD_WALK_DB", "pgq_head_walk_bench")

# The walk of the fair order a claim makes from its claimer's bounds.
BOUNDED_WALK = "SELECT * FROM pgq_flow_head(%s, %s, %s::int2[], %s::float8[], %s::int8[])"


def _enqueue_place() -> str:
    """The place a fair enqueue gives a message of tenant ``t0`` (sql.FAIR_ORDER_ENTRY)."""
    from django_pgqueue.core._sql import FAIR_ORDER_ENTRY

    entry = FAIR_ORDER_ENTRY.format(queue="%(queue)s", priority="0", tenant="'t0'", step="1")
    return f"SELECT {entry}"


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
    from django_pgqueue.core._claim_bound import ClaimBounds

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
            " | walk from the bounds buffers | fair enqueue's place buffers |"
        )
        print("|--:|--:|--:|--:|--:|")
        bounds = ClaimBounds()
        _row(conn, queue, fair, 0, None, bounds)
        claimed = 0
        for _ in range(spells):
            core_cases.warm_up()
            t0 = time.perf_counter()
            done = core_cases.lease_complete_drain(
                CLAIM_BATCH, limit=spell, queue=queue, bounds=bounds
            )
            rate = done / (time.perf_counter() - t0)
            claimed += done
            _row(conn, queue, fair, claimed, rate, bounds)
            if done < spell:
                break


def _row(
    conn: psycopg.Connection[Any],
    queue: str,
    fair: bool,
    claimed: int,
    rate: float | None,
    bounds: ClaimBounds,
) -> None:
    from django_pgqueue.core._manager import _levels_params

    walk = head_walk_buffers(conn, queue, fair)
    bounded = place = "-"
    if fair:
        levels = bounds.known(queue)
        if levels:
            params = [queue, CLAIM_BATCH, *_levels_params(levels)]
            plan_buffers(conn, BOUNDED_WALK, params)  # the function's plan, made once
            bounded = f"{plan_buffers(conn, BOUNDED_WALK, params):,}"
        place = f"{plan_buffers(conn, _enqueue_place(), {'queue': queue}):,}"
    shown = "-" if rate is None else f"{rate:,.0f}"
    print(f"| {claimed:,} | {shown} | {walk:,} | {bounded} | {place} |", flush=True)


if __name__ == "__main__":
    main()
