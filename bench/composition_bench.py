"""Composition: what dependencies and batches cost, and how fast a chain moves.

Creates and drops its own database (``pgq_compose_bench``, or ``BENCH_COMPOSE_DB``) on
``BENCH_SERVER_DSN``::

    python -m bench compose [--quick] [--reps N] [--members N] [--steps N]

1. Plain queues pay nothing: claimer processes drain a backlog of plain messages with
   ``Message.objects.lease`` + ``complete`` (batches of 50), with the composition triggers
   installed and with them dropped (the queue as it was without composition), beside the
   raw-SQL reference (``DELETE ... FOR UPDATE SKIP LOCKED``), in the same repetition.
2. A batch of ``--members`` messages with a completion callback against as many plain
   messages, each drained by 4 worker processes (the worker as ``pgq_worker`` runs it, in
   the bench's processes), timed until the live and waiting tables are empty; the callback
   must have run once.
3. A chain of ``--steps`` steps on one idle worker (concurrency 1, LISTEN on): the gap from a
   step's handler returning to the next step's handler starting, on the host clock the
   handlers read (``bench.timed``); and, on the database clock, from the archiving of a step
   to the claim of the next.

Prints markdown tables; targets: ratios >= 1.0 within noise (1), batch / plain <= 1.2 (2),
gap p50 <= 5 ms and p99 <= 20 ms (3).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from itertools import pairwise

from .measure import percentile
from .report import table
from .study import (
    QUEUE,
    checkpoint,
    claim_batch,
    configure,
    execute,
    migrated_database,
    paired,
    parse,
    parser,
    run_pool,
    running_worker,
)

DBNAME = os.environ.get("BENCH_COMPOSE_DB", "pgq_compose_bench")
CLAIM_BATCH = 50
PGQUEUE = {"NOTIFY": True}


def setup_django() -> None:
    configure(DBNAME, PGQUEUE)


def reset_tables() -> None:
    execute(
        "TRUNCATE pgqueue_message, pgqueue_archive, pgqueue_dead, pgqueue_waiting,"
        " pgqueue_dependency, pgqueue_batch_member, pgqueue_batch"
    )
    checkpoint()


def set_triggers(installed: bool) -> None:
    """The composition triggers on (as migrated) or dropped (a queue without composition)."""
    from django_pgqueue.core import _composition_sql

    for statement in _composition_sql.DROP[:3]:
        execute(statement)
    if installed:
        execute(_composition_sql.TRIGGERS)


def empty() -> bool:
    return not execute(
        "SELECT 1 FROM pgqueue_message UNION ALL SELECT 1 FROM pgqueue_waiting LIMIT 1"
    )


# --- child processes -----------------------------------------------------------------------


def _claim_and_ack(raw: bool) -> int:
    setup_django()
    from django.db import connections

    connections.close_all()
    done = 0
    while True:
        got = claim_batch(QUEUE, CLAIM_BATCH, raw=raw)
        done += got
        if not got and empty():
            break
    connections.close_all()
    return done


def _work(concurrency: int, listen: bool, arriving: bool) -> int:
    """One worker as ``pgq_worker`` runs it, in this process, stopped once nothing is left;
    ``arriving``: the work is enqueued once the worker is up, so an empty queue is waited on
    first (a backlog enqueued before may be drained by the other processes already)."""
    setup_django()
    with running_worker(
        queues=[QUEUE],
        concurrency=concurrency,
        batch_size=CLAIM_BATCH,
        listen=listen,
        poll_interval=1.0,
    ) as worker:
        deadline = time.monotonic() + 30
        while arriving and empty() and time.monotonic() < deadline:
            time.sleep(0.05)
        while not empty():
            time.sleep(0.01)
    return worker.taken


# --- scenarios -----------------------------------------------------------------------------


def claim_ack_rate(total: int, procs: int, *, raw: bool, triggers: bool) -> float:
    import django_pgqueue

    reset_tables()
    set_triggers(triggers)
    django_pgqueue.enqueue_many("bench.noop", [{}] * total, queue=QUEUE)
    execute("ANALYZE pgqueue_message")
    start = time.monotonic()
    done = sum(run_pool([(_claim_and_ack, (raw,))] * procs))
    elapsed = time.monotonic() - start
    assert done == total, (done, total)
    set_triggers(True)
    return total / elapsed


def drain_seconds(total: int, *, batch: bool, triggers: bool = True) -> float:
    """Seconds 4 worker processes take to drain ``total`` plain messages or a batch of
    ``total`` members and its callback."""
    import django_pgqueue
    from django_pgqueue import step

    reset_tables()
    set_triggers(triggers)
    if batch:
        django_pgqueue.enqueue_batch(
            [step("bench.noop", {}, queue=QUEUE) for _ in range(total)],
            on_complete=step("bench.noop", {"callback": True}, queue=QUEUE),
        )
    else:
        django_pgqueue.enqueue_many("bench.noop", [{}] * total, queue=QUEUE)
    execute("ANALYZE pgqueue_message")
    # Timed on the database clock: first claim to last archive.
    run_pool([(_work, (4, True, False))] * 4)
    ((first, last, finished),) = execute(
        "SELECT min(started_at), max(finished_at), count(*) FROM pgqueue_archive"
    )
    set_triggers(True)
    assert finished == total + (1 if batch else 0), finished
    if batch:
        callbacks = execute("SELECT count(*) FROM pgqueue_archive WHERE payload ? 'callback'")
        assert callbacks == [(1,)], callbacks
    return float((last - first).total_seconds())


def chain_gaps(steps: int) -> tuple[list[float], list[float]]:
    """(host-clock gaps, database-clock gaps), in ms, between consecutive steps."""
    from django_pgqueue import enqueue_chain, step

    reset_tables()
    ctx = mp.get_context("fork")
    from django.db import connections

    connections.close_all()
    with ctx.Pool(1) as pool:
        worker = pool.apply_async(_work, (1, True, True))
        time.sleep(2.0)  # the worker is up and listening
        written = enqueue_chain([step("bench.timed", {}, queue=QUEUE) for _ in range(steps)])
        worker.get(timeout=900)
    rows = execute(
        "SELECT message_id, started_at, finished_at, (result->>'start')::float8,"
        " (result->>'end')::float8 FROM pgqueue_archive WHERE message_id = ANY(%s)",
        [written.ids],
    )
    by_id = {row[0]: row[1:] for row in rows}
    host, database = [], []
    for before, after in pairwise(written.ids):
        host.append((by_id[after][2] - by_id[before][3]) * 1000)
        database.append((by_id[after][0] - by_id[before][1]).total_seconds() * 1000)
    return host, database


def main(argv: list[str] | None = None) -> int:
    options = parser("compose", __doc__.split("\n")[0], reps=5, quick="smaller, one repetition")
    options.add_argument("--members", type=int, default=10_000, help="batch members")
    options.add_argument("--steps", type=int, default=1_000, help="chain steps")
    options.add_argument("--plain", type=int, default=40_000, help="messages per claim/ack run")
    args = parse(options, argv, reps=1, members=2_000, steps=200, plain=10_000)
    reps, members, steps, plain = args.reps, args.members, args.steps, args.plain

    with migrated_database(DBNAME, PGQUEUE):
        rates: dict[str, list[float]] = {"raw": [], "off": [], "on": []}
        drains: dict[str, list[float]] = {"off": [], "plain": [], "batch": []}
        for _ in range(reps):
            rates["raw"].append(claim_ack_rate(plain, 4, raw=True, triggers=True))
            rates["off"].append(claim_ack_rate(plain, 4, raw=False, triggers=False))
            rates["on"].append(claim_ack_rate(plain, 4, raw=False, triggers=True))
            drains["off"].append(drain_seconds(members, batch=False, triggers=False))
            drains["plain"].append(drain_seconds(members, batch=False))
            drains["batch"].append(drain_seconds(members, batch=True))
        host, database = chain_gaps(steps)

    def ratio(a: list[float], b: list[float]) -> str:
        return f"{paired(a, b):.2f}"

    msgs = {k: f"{statistics.median(v):,.0f}" for k, v in rates.items()}
    print(f"\n## Plain claim + ack, {plain:,} messages, 4 processes, batches of {CLAIM_BATCH}")
    print(f"(median of {reps}; ratios are each repetition's own, medianed)\n")
    off, on = ratio(rates["off"], rates["raw"]), ratio(rates["on"], rates["raw"])
    rows = [
        ["raw SQL (DELETE ... SKIP LOCKED)", msgs["raw"], "1.00", ""],
        ["django-pgqueue, without composition", msgs["off"], off, "1.00"],
        ["django-pgqueue, with composition", msgs["on"], on, ratio(rates["on"], rates["off"])],
    ]
    print(table(" | msg/s | / raw SQL | / without composition", rows))
    print(f"\n## {members:,} messages drained by 4 worker processes (concurrency 4)\n")
    seconds = {k: f"{statistics.median(v):.2f}" for k, v in drains.items()}
    off, batch = ratio(drains["off"], drains["plain"]), ratio(drains["batch"], drains["plain"])
    rows = [
        ["plain messages, without composition", seconds["off"], off],
        ["plain messages", seconds["plain"], "1.00"],
        ["one batch + completion callback (ran once)", seconds["batch"], batch],
    ]
    print(table(" | seconds | / plain", rows))
    print(f"\n## A chain of {steps:,} steps on one idle worker: gap between steps (ms)\n")
    rows = [
        [name, *(f"{percentile(gaps, q):.2f}" for q in (50, 90, 99)), f"{max(gaps):.2f}"]
        for name, gaps in (
            ("handler end -> next handler start (host)", host),
            ("archived -> next claimed (database)", database),
        )
    ]
    print(table("clock | p50 | p90 | p99 | max", rows) + "\n")
    return 0
