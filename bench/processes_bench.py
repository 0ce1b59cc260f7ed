"""Worker processes: what ``pgq_worker --processes N`` buys CPU-bound handlers, and what the
supervisor costs no-op ones.

Creates and drops its own database (``pgq_processes_bench``, or ``BENCH_PROCESSES_DB``) on
``BENCH_SERVER_DSN``, and runs real ``pgq_worker`` processes (``bench.settings``), each case's
backlog enqueued in one statement once its workers are up and idle::

    python -m bench processes [--quick] [--reps N] [--cpu-messages N] [--noop-messages N]

1. CPU-bound: ``bench.cpu`` (a fixed pure-Python loop, ~25 ms each) drained by one process
   and by ``--processes 2`` and ``--processes 4`` (``--concurrency 2 --batch-size 2`` each,
   so that no process takes more than its share at the start); target: 2
   processes >= 1.7x one process on a 2-core host. More processes than cores show the
   ceiling the host sets.
2. No-op: ``bench.noop`` drained by today's worker (no flag), ``--processes 1`` (the same
   single process) and one supervised child (``--processes 1 --max-tasks-per-child`` larger
   than the backlog: the supervisor and its child); target: within 5% of today's worker.

Throughput is messages / (last ``finished_at`` - first ``started_at``) on the database clock:
what the workers did, without their interpreters' start-up. Repetitions are interleaved;
the table shows the median.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time

from .context import REPO_DIR
from .pg import SERVER_DSN, dsn_for, scratch_database
from .report import table
from .study import QUEUE, checkpoint, configure, execute, parse, parser

DBNAME = os.environ.get("BENCH_PROCESSES_DB", "pgq_processes_bench")

# (name, pgq_worker arguments, target)
CPU_CASES = [
    ("1 process", [], ""),
    ("--processes 2", ["--processes", "2"], ">= 1.7x"),
    ("--processes 4", ["--processes", "4"], ""),
]
NOOP_CASES = [
    ("today's worker (no flag)", [], ""),
    ("--processes 1", ["--processes", "1"], "within 5%"),
    (
        "supervised, 1 child",
        ["--processes", "1", "--max-tasks-per-child", "1000000000"],
        "within 5%",
    ),
]


def environment() -> dict[str, str]:
    dsn = dsn_for(SERVER_DSN, DBNAME)
    settings = "bench.settings"
    return dict(
        os.environ, DJANGO_SETTINGS_MODULE=settings, BENCH_DSN=dsn, PYTHONPATH=str(REPO_DIR)
    )


def migrate() -> None:
    command = [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"]
    subprocess.run(command, cwd=REPO_DIR, env=environment(), check=True)


def drain_rate(task: str, total: int, args: list[str], *, processes: int, batch: int) -> float:
    """Messages per second ``pgq_worker *args`` drains a backlog of ``total``, enqueued once
    its ``processes`` workers are up and idle (their start-up is not measured)."""
    import django_pgqueue

    execute("TRUNCATE pgqueue_message, pgqueue_archive, pgqueue_dead, pgqueue_worker")
    checkpoint()
    command = [
        sys.executable, "-m", "django", "pgq_worker", "--queue", QUEUE,
        "--concurrency", "2" if task == "bench.cpu" else "4", "--batch-size", str(batch),
        "-v", "0", *args,
    ]  # fmt: skip
    proc = subprocess.Popen(command, cwd=REPO_DIR, env=environment())
    try:
        deadline = time.monotonic() + 60
        while execute("SELECT count(*) FROM pgqueue_worker")[0][0] < processes:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{command} did not start {processes} workers")
            time.sleep(0.05)
        django_pgqueue.enqueue_many(task, [{}] * total, queue=QUEUE)
        while execute("SELECT count(*) FROM pgqueue_archive")[0][0] < total:
            if proc.poll() is not None:
                raise RuntimeError(f"{command} exited {proc.returncode}")
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    ((first, last, finished, distinct),) = execute(
        "SELECT min(started_at), max(finished_at), count(*), count(DISTINCT message_id)"
        " FROM pgqueue_archive"
    )
    assert finished == distinct == total, (finished, distinct, total)
    return total / (last - first).total_seconds()


def _count(args: list[str]) -> int:
    return int(args[args.index("--processes") + 1]) if "--processes" in args else 1


def run(reps: int, cpu_messages: int, noop_messages: int) -> str:
    groups = [
        ("bench.cpu", CPU_CASES, cpu_messages, 2),
        ("bench.noop", NOOP_CASES, noop_messages, 100),
    ]
    rates: dict[str, list[float]] = {name: [] for _, cases, _, _ in groups for name, *_ in cases}
    for _ in range(reps):
        for task, cases, total, batch in groups:
            for name, args, _ in cases:
                rate = drain_rate(task, total, args, processes=_count(args), batch=batch)
                rates[name].append(rate)
    rows = []
    for task, cases, total, _ in groups:
        base = statistics.median(rates[cases[0][0]])
        for name, _, target in cases:
            rate = statistics.median(rates[name])
            rows.append([name, task, f"{total:,}", f"{rate:,.1f}", f"{rate / base:.3f}x", target])
    return (
        f"Host: {os.cpu_count()} cores; medians of {reps} interleaved runs; messages/s on the "
        "database clock (first start to last archive).\n\n"
        + table("Case | Handler | Messages | msg/s | vs. first row | Target", rows, left=2)
    )


def main(argv: list[str] | None = None) -> None:
    options = parser("processes", __doc__, reps=3, quick="small backlogs, one run")
    options.add_argument("--cpu-messages", type=int, default=400)
    options.add_argument("--noop-messages", type=int, default=20_000)
    args = parse(options, argv, reps=1, cpu_messages=100, noop_messages=5000)
    with scratch_database(SERVER_DSN, DBNAME):
        configure(DBNAME, {"NOTIFY": True})
        migrate()
        try:
            print(run(args.reps, args.cpu_messages, args.noop_messages))
        finally:
            from django.db import connections

            connections.close_all()
