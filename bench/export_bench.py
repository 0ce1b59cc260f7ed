"""Export bench, whole commands: ``pgq_pipeline export`` (Spark start-up included) against the
one-process psycopg COPY -> pyarrow -> Parquet reference, side by side in one run::

    python -m bench export [--rows 2000000] [--repeat 2] [--master local[2]]

It creates (and drops afterwards) the database ``pgq_export_bench`` on ``BENCH_SERVER_DSN``
and fills the archive with ``--rows`` rows (the same rows as ``python -m bench pipeline``).
Each repetition runs, as fresh processes timed from launch to exit, in alternating order:

- the reference: ``python -c 'baseline_export(...)'`` (interpreter, imports, COPY, Parquet);
- ``python -m django_pgqueue.pipeline export`` into a new directory: Spark start-up, lease,
  verified ranges, one Delta commit per range, everything a user waits for;
- the same export command again, with nothing new to export (decided without Spark).

Prints one table: median seconds and rows/s per side, the median (min-max) of the
per-repetition ratio reference seconds / export seconds, and the CPU seconds of each command
(user + system of the process and the children it waited for; PostgreSQL's own work is not in
it, nor Spark's JVM, which the export process does not wait for) for the reference and the
no-op export, which a loaded machine inflates far less than wall-clock time.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from .context import REPO_DIR
from .pg import SERVER_DSN, scratch_database
from .pipeline_bench import django_env, fill_archive
from .report import table

DB_NAME = "pgq_export_bench"


def run_timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and the children it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO_DIR, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])}... failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench export", description=__doc__.split("::")[0]
    )
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    timings: dict[str, list[float]] = {"reference": [], "export": [], "no-op export": []}
    cpu: dict[str, list[float]] = {side: [] for side in timings}
    work = Path(tempfile.mkdtemp(prefix="pgq-export-bench-"))
    with scratch_database(SERVER_DSN, DB_NAME) as dsn:
        env = {**os.environ, **django_env(dsn), "SPARK_LOCAL_IP": "127.0.0.1"}
        try:
            migrate = [sys.executable, "example_project/manage.py", "migrate", "-v0"]
            subprocess.run(migrate, cwd=REPO_DIR, env=env, check=True)
            print(f"filling {args.rows:,} archive rows", file=sys.stderr)
            with psycopg.connect(dsn, autocommit=True) as conn:
                fill_archive(conn, args.rows)
            for rep in range(args.repeat):
                call = f"baseline_export({dsn!r}, Path({str(work / f'ref-{rep}')!r}))"
                imports = (
                    "from pathlib import Path; from bench.pipeline_bench import baseline_export"
                )
                reference = [sys.executable, "-c", f"{imports}; {call}"]
                job = [
                    sys.executable, "-m", "django_pgqueue.pipeline", "--master", args.master,
                    "export", str(work / f"export-{rep}"), "--source", "archive",
                ]  # fmt: skip
                # Alternating which goes first; then the export again, with nothing new.
                order = ["reference", "export"] if rep % 2 == 0 else ["export", "reference"]
                for side in [*order, "no-op export"]:
                    seconds, used = run_timed(reference if side == "reference" else job, env)
                    timings[side].append(seconds)
                    cpu[side].append(used)
                    print(
                        f"rep {rep + 1}: {side} {seconds:.1f} s, {used:.1f} s CPU", file=sys.stderr
                    )
        finally:
            shutil.rmtree(work, ignore_errors=True)
    ratios = [r / e for r, e in zip(timings["reference"], timings["export"], strict=True)]
    print(f"\n{args.rows:,} archive rows, Spark {args.master}, {args.repeat} repetitions, "
          "whole commands (process start to exit); load average (1/5/15 min) at the end: "
          + "/".join(f"{x:.1f}" for x in os.getloadavg()) + "\n")  # fmt: skip
    rows = []
    for side, values in timings.items():
        median = statistics.median(values)
        rate = f"{args.rows / median:,.0f}" if side != "no-op export" else "-"
        ratio = used = ""
        if side == "export":
            ratio = f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f})"
            used = "-"  # Spark's JVM is not waited for by the export process: not in the count.
        else:
            used = f"{statistics.median(cpu[side]):.1f}"
        rows.append([side, f"{median:.1f}", rate, ratio, used])
    header = "side | seconds (median) | rows/s | x reference, median (min-max) | CPU s (median)"
    print(table(header, rows))
    return 0
