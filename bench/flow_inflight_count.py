"""What counting a limited queue's leases in flight costs under a steady load, over time.

A serialized claim of a queue with a concurrency limit counts the queue's leases in flight
(as does an optimistic claim of a few messages while few are in flight; the others read the
count that claims and acks keep, see ``flow_control.KEPT_COUNT_BATCH``): an index-only range
scan of ``pgq_message_leased``. The range also holds the entries of leases
finished moments ago (acks commit asynchronously: until a finished lease's commit is on disk
its entry cannot be marked dead, so the count visits the row). Does that grow with the claim
rate times the visibility timeout, as entries pile up until vacuum? This runs claimer
processes (``lease()`` + ``complete()``) against a producer (``enqueue_many``) on a queue
with fairness and limits for ``--seconds``, and samples the count as the claim runs it (same
settings: no sequential or bitmap scan) every ``--every`` seconds::

    .venv/bin/python bench/flow_inflight_count.py [--seconds 40] [--claimers 3] [--batch 100]

Prints a markdown table: in flight, table rows visited (heap fetches), index and table
buffers, execution time, the table's live and dead row counts, and whether autovacuum ran.
Uses the scratch database of ``flow_control_bench.py`` (``pgq_flow_bench``): run one at a time.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import flow_control_bench as fcb  # noqa: E402
from bench.pg import scratch_database  # noqa: E402

QUEUE = "flow"  # fairness, a key limit, a queue limit and a rate (flow_control_bench.FLOW_ON)
COUNT = (
    "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY ON) SELECT count(*)::int FROM pgqueue_message "
    "WHERE queue = %s AND lease_token IS NOT NULL AND fair_order < 0 AND available_at > now()"
)


def _claim(stop_at: float, batch: int) -> int:
    fcb.setup_django()
    from django.db import connections

    from django_pgqueue.core import transitions
    from django_pgqueue.models import Message

    connections.close_all()
    done = 0
    while time.monotonic() < stop_at:
        leased = Message.objects.lease(QUEUE, worker_id=f"w{os.getpid()}", batch_size=batch)
        if leased:
            transitions.complete(leased)
            done += len(leased)
        else:
            time.sleep(0.002)
    return done


def _produce(stop_at: float) -> int:
    fcb.setup_django()
    from django.db import connections

    import django_pgqueue

    connections.close_all()
    sent = 0
    while time.monotonic() < stop_at:
        tenant = f"t{(sent // 500) % 50}"
        sent += django_pgqueue.enqueue_many("bench.noop", [{}] * 500, queue=QUEUE, tenant=tenant)
    return sent


def sample() -> dict[str, str]:
    fcb.execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
    plan = "\n".join(row[0] for row in fcb.execute(COUNT, [QUEUE]))
    stats = fcb.execute(
        "SELECT n_live_tup, n_dead_tup, autovacuum_count FROM pg_stat_user_tables "
        "WHERE relname = 'pgqueue_message'"
    )[0]

    def found(pattern: str) -> str:
        match = re.search(pattern, plan)
        return match.group(1) if match else "-"

    return {
        "in flight": found(r"Index Only Scan.*?actual rows=(\d+)"),
        "rows visited": found(r"Heap Fetches: (\d+)"),
        "buffers": found(r"Buffers: shared hit=(\d+)"),
        "ms": found(r"Execution Time: ([\d.]+)"),
        "live rows": f"{stats[0]:,}",
        "dead rows": f"{stats[1]:,}",
        "autovacuums": str(stats[2]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--claimers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--every", type=float, default=4.0, help="seconds between samples")
    args = parser.parse_args()
    with scratch_database(fcb.SERVER_DSN, fcb.DBNAME):
        fcb.setup_django()
        from django.core.management import call_command
        from django.db import connections

        call_command("migrate", verbosity=0)
        connections.close_all()
        start = time.monotonic()
        stop_at = start + args.seconds
        jobs = [(_claim, (stop_at, args.batch))] * args.claimers + [(_produce, (stop_at,))]
        with mp.get_context("fork").Pool(len(jobs)) as pool:
            results = [pool.apply_async(fn, job_args) for fn, job_args in jobs]
            print(
                f"## In-flight count under load: {args.claimers} claimers at batch "
                f"{args.batch} + 1 producer, queue {QUEUE!r}\n"
            )
            columns = ["s", "in flight", "rows visited", "buffers", "ms", "live rows"]
            columns += ["dead rows", "autovacuums"]
            print("| " + " | ".join(columns) + " |")
            print("|" + "---:|" * len(columns))
            while time.monotonic() + args.every < stop_at:
                time.sleep(args.every)
                row = {"s": f"{time.monotonic() - start:.0f}", **sample()}
                print("| " + " | ".join(row[c] for c in columns) + " |", flush=True)
            counts = [r.get(timeout=args.seconds + 60) for r in results]
        claimed, sent = sum(counts[:-1]), counts[-1]
        print(f"\nclaimed {claimed:,} ({claimed / args.seconds:,.0f}/s), enqueued {sent:,}")
        connections.close_all()


if __name__ == "__main__":
    main()
