"""Worker processes: what ``pgq_worker --processes N`` buys CPU-bound handlers, and what the
supervisor costs no-op ones.

Self-contained: creates and drops its own database (``pgq_processes_bench``, or
``BENCH_PROCESSES_DB``) on the server named by ``BENCH_SERVER_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``), and runs real ``pgq_worker --burst``
processes (``bench.settings``), each case's backlog enqueued in one statement once its
workers are up and idle (start-up is not what is measured)::

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

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .pg import dsn_for, scratch_database
from .scratch_django import checkpoint, configure, execute

SERVER_DSN = os.environ.get("BENCH_SERVER_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
DBNAME = os.environ.get("BENCH_PROCESSES_DB", "pgq_processes_bench")
QUEUE = "bench"
REPO = Path(__file__).resolve().parents[1]

CPU_CASES = [
    ("1 process", []),
    ("--processes 2", ["--processes", "2"]),
    ("--processes 4", ["--processes", "4"]),
]
NOOP_CASES = [
    ("today's worker (no flag)", []),
    ("--processes 1", ["--processes", "1"]),
    ("supervised, 1 child", ["--processes", "1", "--max-tasks-per-child", "1000000000"]),
]


def environment() -> dict[str, str]:
    return dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="bench.settings",
        BENCH_DSN=dsn_for(SERVER_DSN, DBNAME),
        PYTHONPATH=str(REPO),
    )


def migrate() -> None:
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
        cwd=REPO,
        env=environment(),
        check=True,
    )


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
    proc = subprocess.Popen(command, cwd=REPO, env=environment())
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
    cpu: dict[str, list[float]] = {name: [] for name, _ in CPU_CASES}
    noop: dict[str, list[float]] = {name: [] for name, _ in NOOP_CASES}
    for _ in range(reps):
        for name, args in CPU_CASES:
            cpu[name].append(
                drain_rate("bench.cpu", cpu_messages, args, processes=_count(args), batch=2)
            )
        for name, args in NOOP_CASES:
            noop[name].append(
                drain_rate("bench.noop", noop_messages, args, processes=_count(args), batch=100)
            )
    lines = [
        f"Host: {os.cpu_count()} cores; medians of {reps} interleaved runs; messages/s on the "
        "database clock (first start to last archive).",
        "",
        "| Case | Handler | Messages | msg/s | vs. first row | Target |",
        "|---|---|---:|---:|---:|---|",
    ]
    base = statistics.median(cpu["1 process"])
    for name, _ in CPU_CASES:
        rate = statistics.median(cpu[name])
        target = ">= 1.7x" if name == "--processes 2" else ""
        lines.append(
            f"| {name} | bench.cpu | {cpu_messages:,} | {rate:,.1f} | {rate / base:.2f}x "
            f"| {target} |"
        )
    base = statistics.median(noop["today's worker (no flag)"])
    for name, _ in NOOP_CASES:
        rate = statistics.median(noop[name])
        target = "" if name.startswith("today") else "within 5%"
        lines.append(
            f"| {name} | bench.noop | {noop_messages:,} | {rate:,.0f} | {rate / base:.3f}x "
            f"| {target} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench processes", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small backlogs, one run")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cpu-messages", type=int, default=400)
    parser.add_argument("--noop-messages", type=int, default=20_000)
    options = parser.parse_args(argv)
    if options.quick:
        options.reps, options.cpu_messages, options.noop_messages = 1, 100, 5000
    with scratch_database(SERVER_DSN, DBNAME):
        configure(SERVER_DSN, DBNAME, {"NOTIFY": True})
        migrate()
        try:
            print(run(options.reps, options.cpu_messages, options.noop_messages))
        finally:
            from django.db import connections

            connections.close_all()


if __name__ == "__main__":
    main()
