"""Where a claim's CPU goes: this process's and its database backend's, per message.

Self-contained (creates and drops ``pgq_flow_bench`` like ``flow_control_bench.py``; run it
alone: never beside another benchmark or the tests)::

    .venv/bin/python bench/claim_cpu.py [--claims N] [--chunks N] [--batch N]

One process leases and completes ``--claims`` messages per queue with ``lease()`` +
``complete()``, in chunks taken in turn from each queue (so that a shared machine's drift
moves all of them alike): a plain queue, a fair one, the fully flow-controlled one of
``flow_control_bench.py`` (fairness, a key limit, a queue limit and a rate, none binding), and
fairness with each limit alone. For each chunk it
reads its own CPU time (``time.process_time``) and the backend's (``/proc/<pid>/schedstat``, so the server must run
on this host; otherwise only the client's is shown). The table shows medians over chunks, in
microseconds per message, and the total against the plain queue's.

With 4 claimer processes on 2 cores (``flow_control_bench.py``), throughput is CPU-bound: the
ratio of these totals is about the throughput ratio there, before contention.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import flow_control_bench as flow_bench  # noqa: E402

QUEUES = (
    ("plain", "plain (no flow control)"),
    ("fair", "fairness only"),
    ("flow_rate", "fairness + RATE_LIMIT 1e6/s"),
    ("flow_limit", "fairness + CONCURRENCY_LIMIT 10,000"),
    ("flow_key", "fairness + KEY_CONCURRENCY_LIMIT 1,000"),
    ("flow", "flow on (all of them)"),
)


def backend_cpu(pid: int) -> float | None:
    """Seconds of CPU the backend ``pid`` has run (``None`` off this host)."""
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            return int(stat.read().split()[0]) / 1e9
    except OSError:
        return None


def measure(claims: int, chunks: int, batch: int) -> dict[str, list[tuple[float, float | None]]]:
    from django_pgqueue.core import transitions
    from django_pgqueue.models import Message

    def claim(queue: str) -> list[Message]:
        return Message.objects.lease(queue, worker_id="cpu", batch_size=batch)

    per_chunk = max(1, claims // chunks)
    flow_bench.reset_tables()
    for queue, _ in QUEUES:
        # Enough for every chunk, and a warm-up that plans and prepares each claim.
        flow_bench.prefill(queue, (per_chunk * chunks + 50) * batch)
        for _ in range(50):
            transitions.complete(claim(queue))
    flow_bench.checkpoint()
    pid = flow_bench.execute("SELECT pg_backend_pid()")[0][0]
    costs: dict[str, list[tuple[float, float | None]]] = {queue: [] for queue, _ in QUEUES}
    for _ in range(chunks):
        for queue, _ in QUEUES:
            client, server, done = time.process_time(), backend_cpu(pid), 0
            for _ in range(per_chunk):
                leased = claim(queue)
                done += len(leased)
                transitions.complete(leased)
            assert done == per_chunk * batch, (queue, done)
            client = (time.process_time() - client) / done * 1e6
            after = backend_cpu(pid)
            costs[queue].append(
                (client, None if server is None or after is None else (after - server) / done * 1e6)
            )
    return costs


def report(costs: dict[str, list[tuple[float, float | None]]], claims: int, batch: int) -> None:
    print(
        f"## CPU per message, lease() + complete() at batch {batch} "
        f"(us, median of chunks; {claims:,} claims a queue)\n"
    )
    print("| queue | this process | database backend | total | total / plain |")
    print("|---|---:|---:|---:|---:|")
    totals: dict[str, float] = {}
    for queue, label in QUEUES:
        client = statistics.median(c for c, _ in costs[queue])
        servers = [s for _, s in costs[queue] if s is not None]
        server = statistics.median(servers) if servers else float("nan")
        totals[queue] = statistics.median(c + (s or 0.0) for c, s in costs[queue])
        print(
            f"| {label} | {client:,.0f} | {server:,.0f} | {totals[queue]:,.0f} | "
            f"{totals[queue] / totals['plain']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--claims", type=int, default=4_000, help="claims per queue")
    parser.add_argument("--chunks", type=int, default=40, help="turns taken between queues")
    parser.add_argument("--batch", type=int, default=1, help="messages per claim")
    args = parser.parse_args()
    with flow_bench.migrated_database():
        report(measure(args.claims, args.chunks, args.batch), args.claims, args.batch)


if __name__ == "__main__":
    main()
