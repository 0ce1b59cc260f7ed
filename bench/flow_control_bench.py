"""Flow control: what fairness and limits cost, and what they buy a light tenant.

Creates and drops its own database (``pgq_flow_bench``, or ``BENCH_FLOW_DB``) on
``BENCH_SERVER_DSN``::

    python -m bench flow [--quick] [--reps N] [--scale K]

1. Throughput: claimer processes drain a prefilled backlog (1 heavy tenant with half the
   messages, the rest over 99 light tenants) with ``Message.objects.lease`` + ``complete``,
   once on a plain queue, once on a queue with fairness alone, and once on a queue with
   fairness, a per-key limit, a queue limit and a rate limit all switched on (set high
   enough not to bind: this measures their cost).
   A raw-SQL reference (``DELETE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)``) runs
   in the same session. Each is run with no work per message (the claim's cost laid bare:
   claims of a flow-controlled queue are serialized) and with 1 ms of work per message.
2. The same end to end: ``pgq_worker`` processes (no-op handler, polling, stopped once the
   queue is empty) drain the backlog of the plain queue, then of the flow-controlled one. Here
   the claim overlaps with the handlers and the acknowledgements, as in production.
3. Claim cost with leases in flight (``--only held``): one process holds 0 to 10,000 leases
   while another claims and completes batches, on a plain queue, on a queue with fairness, a
   concurrency limit and a rate, on a queue with key limits (a default one and a tenant's
   own), and on one with a key limit and a key rate.
4. Light tenant latency: claimers that spend ``work`` ms per message serve a light tenant
   producing a steady trickle, alone and then beside a heavy tenant enqueueing 100x as much
   (fairness on; and, for contrast, off). Wait = lease time - enqueue time, database clock.

Prints markdown tables; the ratios are the targets (throughput on/off >= 0.8; light p99
with heavy / alone <= 2). A throughput ratio is the median of the repetitions' own ratios
(the runs of one repetition follow each other, so slow drift of a shared machine moves both
sides alike); the throughputs shown are medians. Messages are written with ``enqueue_many``
(a fair queue's take their place in its fair order at enqueue).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from .measure import percentile
from .study import (
    checkpoint,
    claim_batch,
    configure,
    execute,
    migrated_database,
    paired,
    parser,
    ratios,
    run_pool,
    running_worker,
)

DBNAME = os.environ.get("BENCH_FLOW_DB", "pgq_flow_bench")

FLOW_ON = {
    "FAIRNESS": True,
    "KEY_CONCURRENCY_LIMIT": 1000,
    "CONCURRENCY_LIMIT": 10000,
    "RATE_LIMIT": 1_000_000,
}
# Another "flow on" configuration, as JSON (e.g. '{"FAIRNESS": true, "RATE_LIMIT": 100000}'):
# to see what each limit costs on its own.
if os.environ.get("BENCH_FLOW_ON"):
    FLOW_ON = json.loads(os.environ["BENCH_FLOW_ON"])


PGQUEUE = {
    "NOTIFY": False,
    "QUEUES": {
        "flow": FLOW_ON,
        "fair": {"FAIRNESS": True},
        # Many leases in flight: no key limit (it would bind), a queue limit far off.
        "limited": {"FAIRNESS": True, "CONCURRENCY_LIMIT": 50_000, "RATE_LIMIT": 1e6},
        # Key limits, a default and one of a tenant's own (--only held).
        "keyed": {
            "FAIRNESS": True,
            "KEY_CONCURRENCY_LIMIT": 50_000,
            "KEY_CONCURRENCY_LIMITS": {"heavy": 100_000},
        },
        "key_rate": {
            "FAIRNESS": True,
            "KEY_CONCURRENCY_LIMIT": 50_000,
            "KEY_RATE_LIMIT": 1e6,
        },
    },
}


def setup_django() -> None:
    configure(DBNAME, PGQUEUE)


def reset_tables() -> None:
    execute(
        "TRUNCATE pgqueue_message, pgqueue_archive, pgqueue_dead, pgqueue_flow_allowance, "
        "pgqueue_flow_rate"
    )


def prefill(queue: str, total: int) -> None:
    """Half the backlog for one heavy tenant, the rest over 99 light ones, through
    ``enqueue_many`` (one call per tenant), as an application would write it."""
    import django_pgqueue

    heavy = total // 2
    django_pgqueue.enqueue_many("bench.noop", [{}] * heavy, queue=queue, tenant="heavy")
    light = total - heavy
    for n in range(99):
        count = light // 99 + (1 if n < light % 99 else 0)
        if count:
            django_pgqueue.enqueue_many(
                "bench.noop", [{}] * count, queue=queue, tenant=f"light-{n}"
            )
    execute("ANALYZE pgqueue_message")


# --- child processes -----------------------------------------------------------------------


def _drain(queue: str, batch: int, work_ms: float, stop_at: float, mode: str) -> int:
    setup_django()
    from django.db import connections

    from django_pgqueue.models import Message

    connections.close_all()
    done = 0
    while time.monotonic() < stop_at:
        got = claim_batch(queue, batch, raw=mode == "raw", work_ms=work_ms)
        done += got
        if not got:
            if mode == "drain" or mode == "raw":
                if not Message.objects.filter(queue=queue).exists():
                    break
            time.sleep(0.002)
    connections.close_all()
    return done


def _work(queue: str, batch: int, concurrency: int) -> int:
    """One ``pgq_worker`` as it runs in production (not ``--burst``: a short claim is not the
    end), without LISTEN (nothing is enqueued meanwhile), in this process, stopped once the
    queue is empty; returns what it leased."""
    setup_django()
    from django_pgqueue.models import Message

    with running_worker(
        queues=[queue], concurrency=concurrency, batch_size=batch, listen=False
    ) as worker:
        while Message.objects.filter(queue=queue).exists():
            time.sleep(0.01)
    return worker.taken


def _produce(queue: str, heavy_per_tick: int, tick: float, stop_at: float) -> int:
    """One light message every ``tick`` s; with it ``heavy_per_tick`` heavy ones."""
    setup_django()
    from django.db import connections

    import django_pgqueue

    connections.close_all()
    sent = 0
    next_at = time.monotonic()
    while time.monotonic() < stop_at:
        django_pgqueue.enqueue("bench.noop", {}, queue=queue, tenant="light")
        if heavy_per_tick:
            django_pgqueue.enqueue_many(
                "bench.noop", [{}] * heavy_per_tick, queue=queue, tenant="heavy"
            )
        sent += 1
        next_at += tick
        time.sleep(max(0.0, next_at - time.monotonic()))
    connections.close_all()
    return sent


# --- scenarios -----------------------------------------------------------------------------


def throughput(
    queue: str, mode: str, total: int, procs: int, batch: int, work_ms: float = 0.0
) -> float:
    reset_tables()
    prefill(queue, total)
    checkpoint()
    start = time.monotonic()
    counts = run_pool([(_drain, (queue, batch, work_ms, start + 600, mode))] * procs)
    elapsed = time.monotonic() - start
    assert sum(counts) == total, (sum(counts), total)
    return total / elapsed


def worker_throughput(queue: str, total: int, workers: int, batch: int, concurrency: int) -> float:
    reset_tables()
    prefill(queue, total)
    checkpoint()
    start = time.monotonic()
    run_pool([(_work, (queue, batch, concurrency))] * workers)
    elapsed = time.monotonic() - start
    archived = execute("SELECT count(*) FROM pgqueue_archive WHERE queue = %s", [queue])[0][0]
    assert archived == total, (archived, total)
    return total / elapsed


LIGHT_TICK = 0.05  # the light tenant enqueues 20 messages a second
HEAVY_PER_TICK = 100  # the heavy one 100x as many


def light_waits(queue: str, heavy: bool, seconds: float, procs: int, batch: int, work_ms: float):
    reset_tables()
    if heavy:  # a standing backlog, so the heavy tenant saturates the claimers from the start
        import django_pgqueue

        django_pgqueue.enqueue_many("bench.noop", [{}] * 5000, queue=queue, tenant="heavy")
    start = time.monotonic()
    stop_at = start + seconds
    jobs: list[tuple[Any, tuple[Any, ...]]] = [
        (_produce, (queue, HEAVY_PER_TICK if heavy else 0, LIGHT_TICK, stop_at))
    ]
    jobs += [(_drain, (queue, batch, work_ms, stop_at + 1.0, "steady"))] * procs
    run_pool(jobs)
    waits = [
        float(w) * 1000
        for (w,) in execute(
            "SELECT extract(epoch FROM started_at - enqueued_at) FROM pgqueue_archive "
            "WHERE tenant = 'light' AND queue = %s",
            [queue],
        )
    ]
    left = execute(
        "SELECT count(*) FROM pgqueue_message WHERE tenant = 'light' AND queue = %s", [queue]
    )[0][0]
    return waits, left


def report_throughput(
    totals: dict[int, int], reps: int, procs: int, claims_only: bool = False
) -> None:
    """Drain with no work per message (the claim's cost laid bare), then with 1 ms of work
    (``claims_only``: only the plain, fairness-only and flow-on drains)."""
    print(f"## Throughput: {procs} claimer processes (msgs/s, median of {reps})\n")
    print(
        "| batch | raw SQL claim+delete | plain | fairness only | fair / plain | flow on "
        "| on / plain | plain, 1 ms work/msg | flow on, 1 ms work/msg | on / plain |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    spreads: dict[int, list[float]] = {}
    for batch, total in totals.items():
        runs: dict[str, list[float]] = {k: [] for k in ("raw", "plain", "fair", "flow", "pw", "fw")}
        worked = max(1_000, total // 3)  # 1 ms a message: keep these runs short
        for _ in range(reps):
            runs["plain"].append(throughput("plain", "drain", total, procs, batch))
            runs["fair"].append(throughput("fair", "drain", total, procs, batch))
            runs["flow"].append(throughput("flow", "drain", total, procs, batch))
            if not claims_only:
                runs["raw"].append(throughput("raw", "raw", total, procs, batch))
                runs["pw"].append(throughput("plain", "drain", worked, procs, batch, 1.0))
                runs["fw"].append(throughput("flow", "drain", worked, procs, batch, 1.0))
        m = {k: f"{statistics.median(v):,.0f}" if v else "-" for k, v in runs.items()}
        worked_ratio = f"{paired(runs['fw'], runs['pw']):.2f}" if runs["pw"] else "-"
        print(
            f"| {batch} | {m['raw']} | {m['plain']} | {m['fair']} | "
            f"{paired(runs['fair'], runs['plain']):.2f} | {m['flow']} | "
            f"{paired(runs['flow'], runs['plain']):.2f} | {m['pw']} | {m['fw']} | {worked_ratio} |"
        )
        spreads[batch] = ratios(runs["flow"], runs["plain"])
    each = "; ".join(
        f"batch {batch} " + ", ".join(f"{r:.2f}" for r in spread)
        for batch, spread in spreads.items()
    )
    print(f"\nFlow on / plain, each repetition (the table shows their median): {each}")


def report_workers(totals: dict[int, int], reps: int, workers: int, concurrency: int) -> None:
    """End to end through the worker: what a deployment sees with no-op handlers."""
    print(
        f"\n## Throughput through pgq_worker: {workers} worker processes x concurrency "
        f"{concurrency}, polling, no-op handler (msgs/s, median of {reps})\n"
    )
    print("| batch | plain | fairness only | fair / plain | flow on | on / plain |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch, total in totals.items():
        runs: dict[str, list[float]] = {"plain": [], "fair": [], "flow": []}
        for _ in range(reps):
            for queue, results in runs.items():
                results.append(worker_throughput(queue, total, workers, batch, concurrency))
        p, a, f = (statistics.median(runs[k]) for k in ("plain", "fair", "flow"))
        fair, flow = paired(runs["fair"], runs["plain"]), paired(runs["flow"], runs["plain"])
        print(f"| {batch} | {p:,.0f} | {a:,.0f} | {fair:.2f} | {f:,.0f} | {flow:.2f} |")


def report_latency(seconds: float, reps: int, procs: int, batch: int) -> None:
    work_ms = 1.0
    light_rate = 1 / LIGHT_TICK
    print(
        f"\n## Light tenant wait (ms, enqueue -> lease, database clock): {seconds:.0f} s runs, "
        f"{procs} claimers, batch {batch}, {work_ms} ms of work per message; light "
        f"enqueues {light_rate:.0f}/s, heavy {light_rate * HEAVY_PER_TICK:,.0f}/s on top "
        "of a 5,000 backlog\n"
    )
    print(f"| run ({reps} runs pooled) | light msgs | p50 | p99 | max | light left unserved |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = {}
    for label, queue, heavy in (
        ("light alone (fair queue)", "fair", False),
        ("light + 100x heavy, fairness on", "fair", True),
        ("light + 100x heavy, fairness off", "plain", True),
    ):
        waits: list[float] = []
        left = 0
        for _ in range(reps):  # pooled over the repetitions
            more, unserved = light_waits(queue, heavy, seconds, procs, batch, work_ms)
            waits += more
            left += unserved
        rows[label] = waits
        print(
            f"| {label} | {len(waits)} | {percentile(waits, 50):.1f} | {percentile(waits, 99):.1f} | "
            f"{max(waits, default=float('nan')):.1f} | {left} |"
        )
    alone = percentile(rows["light alone (fair queue)"], 99)
    fair = percentile(rows["light + 100x heavy, fairness on"], 99)
    print(f"\nlight p99 with heavy / alone (fairness on): {fair / alone:.2f}")


HELD = (0, 2_000, 10_000)


def _cycle_times(queue: str, batch: int, cycles: int) -> list[float]:
    """Seconds each of ``cycles`` lease + complete cycles took, in this process."""
    from django_pgqueue.core import transitions
    from django_pgqueue.models import Message

    times = []
    for _ in range(cycles):
        start = time.perf_counter()
        leased = Message.objects.lease(queue, worker_id="bench", batch_size=batch)
        assert leased, "the backlog ran out"
        transitions.complete(leased)
        times.append(time.perf_counter() - start)
    return times


def report_held(reps: int, cycles: int) -> None:
    """What a claim and its ack cost with many leases in flight (exact claims count them)."""
    from django_pgqueue.models import Message

    print(
        "## Claim + ack with leases in flight (one claimer, us per lease() + complete(), "
        f"median of {reps} x {cycles})"
    )
    print()
    print(
        "| in flight | batch | plain | queue limit + rate | key limits | key limit + key rate "
        "| limits / plain | key limits / plain | + key rate / plain |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    queues = ("plain", "limited", "keyed", "key_rate")
    for held in HELD:
        for batch in (1, 10, 100):
            reset_tables()
            backlog = held + (1 + 2 * reps) * cycles * batch
            for queue in queues:
                prefill(queue, backlog)
            for queue in queues:  # another process's leases, long ones
                taken = 0
                while taken < held:
                    taken += len(
                        Message.objects.lease(
                            queue,
                            worker_id="holder",
                            batch_size=min(100, held - taken),
                            visibility_timeout=3600,
                        )
                    )
            times: dict[str, list[float]] = {queue: [] for queue in queues}
            for _ in range(reps):
                for queue in queues:
                    times[queue] += _cycle_times(queue, batch, cycles)
            m = {k: statistics.median(v) * 1e6 for k, v in times.items()}
            flows = ("limited", "keyed", "key_rate")
            print(
                f"| {held:,} | {batch} | {m['plain']:,.0f} | "
                + " | ".join(f"{m[k]:,.0f}" for k in flows)
                + " | "
                + " | ".join(f"{m[k] / m['plain']:.2f}" for k in flows)
                + " |"
            )
    print()


def main(argv: list[str] | None = None) -> int:
    options = parser("flow", __doc__.split("\n")[0], reps=3, quick="smaller backlog, shorter runs")
    options.add_argument("--procs", type=int, default=4, help="claimer processes")
    options.add_argument(
        "--latency-batch", type=int, default=4, help="batch size in the latency runs"
    )
    options.add_argument("--workers", type=int, default=2, help="pgq_worker processes")
    options.add_argument(
        "--only",
        choices=("throughput", "workers", "held", "latency"),
        help="run one part only",
    )
    options.add_argument(
        "--batches", default="1,10,100", help="batch sizes to run, comma-separated (1, 10, 100)"
    )
    options.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply the backlogs: longer drains, less noise from a shared machine",
    )
    options.add_argument(
        "--claims-only",
        action="store_true",
        help="throughput: only the plain, fairness-only and flow-on drains (no raw SQL, no work)",
    )
    args = options.parse_args(argv)
    # Messages drained per batch size: batch 1 costs a commit per message.
    totals = (
        {1: 1_000, 10: 4_000, 100: 10_000} if args.quick else {1: 6_000, 10: 30_000, 100: 80_000}
    )
    wanted = {int(b) for b in args.batches.split(",")}
    totals = {
        batch: round(total * args.scale) for batch, total in totals.items() if batch in wanted
    }
    seconds = 4.0 if args.quick else 10.0
    reps = 1 if args.quick else args.reps

    with migrated_database(DBNAME, PGQUEUE):
        if args.only in (None, "throughput"):
            report_throughput(totals, reps, args.procs, args.claims_only)
        if args.only in (None, "workers"):
            report_workers(totals, reps, args.workers, concurrency=4)
        if args.only in (None, "held"):
            report_held(reps, cycles=50 if args.quick else 100)
        if args.only in (None, "latency"):
            report_latency(seconds, reps, args.procs, args.latency_batch)
    return 0
