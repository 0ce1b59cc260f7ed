"""Export bench, whole commands: ``pgq_pipeline export`` (Spark start-up included) against the
one-process psycopg COPY -> pyarrow -> Parquet reference, side by side in one run.

Run from the repository root:

    python -m bench export --rows 2000000 --repeat 2

It creates (and drops afterwards) the database ``pgq_export_bench`` (``--db-name``) and fills the archive with
``--rows`` rows (the same rows as ``python -m bench pipeline``). Each repetition runs, as fresh
processes timed from launch to exit, in alternating order:

- the reference: ``python -c 'baseline_export(...)'`` (interpreter, imports, COPY, Parquet);
- ``python -m django_pgqueue.pipeline export`` into a new directory: Spark start-up, lease,
  verified ranges, one Delta commit per range, everything a user waits for;
- the same export command again, with nothing new to export (decided without Spark);
- with ``--compare-tree DIR`` (e.g. ``git archive main | tar -x -C DIR``), the export command
  of that checkout too, into its own directory, so old and new code are timed in one run.

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
from psycopg.conninfo import conninfo_to_dict, make_conninfo

REPO = Path(__file__).resolve().parent.parent
DB_NAME = "pgq_export_bench"


def run_timed(command: list[str], env: dict[str, str], cwd: Path = REPO) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and the children it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])}... failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench export", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--db-name", default=DB_NAME, help="Bench database (created, dropped).")
    parser.add_argument(
        "--compare-tree", type=Path, help="Another checkout whose export is timed alongside."
    )
    parser.add_argument(
        "--server-dsn",
        default=os.environ.get("BENCH_SERVER_DSN", "postgres://postgres@127.0.0.1:5432/postgres"),
    )
    args = parser.parse_args(argv)
    db_name = args.db_name
    dsn = make_conninfo(args.server_dsn, dbname=db_name)
    params = conninfo_to_dict(dsn)
    url = (
        f"postgres://{params.get('user', 'postgres')}"
        + (f":{params['password']}" if params.get("password") else "")
        + f"@{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}/{db_name}"
    )
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "example_project")]),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    with psycopg.connect(args.server_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db_name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {db_name}")
    work = Path(tempfile.mkdtemp(prefix="pgq-export-bench-"))
    timings: dict[str, list[float]] = {"reference": [], "export": [], "no-op export": []}
    other_env = {}
    other = REPO
    if args.compare_tree is not None:
        other = args.compare_tree.resolve()
        timings["export, compared tree"] = []
        other_env = {
            **env,
            "PYTHONPATH": os.pathsep.join([str(other), str(other / "example_project")]),
        }
    cpu: dict[str, list[float]] = {side: [] for side in timings}
    try:
        subprocess.run(
            [sys.executable, "example_project/manage.py", "migrate", "-v0"],
            cwd=REPO, env=env, check=True,
        )  # fmt: skip
        sys.path.insert(0, str(REPO))
        from bench.pipeline_bench import fill_archive

        print(f"filling {args.rows:,} archive rows", file=sys.stderr)
        with psycopg.connect(dsn, autocommit=True) as conn:
            fill_archive(conn, args.rows)
        python = sys.executable
        for rep in range(args.repeat):
            reference = [
                python, "-c",
                "import sys; from pathlib import Path; from bench.pipeline_bench import "
                f"baseline_export; baseline_export({dsn!r}, Path({str(work / f'ref-{rep}')!r}))",
            ]  # fmt: skip
            destination = str(work / f"export-{rep}")
            job = [
                python, "-m", "django_pgqueue.pipeline", "--master", args.master, "export",
                destination, "--source", "archive",
            ]  # fmt: skip
            commands = {"reference": (reference, env, REPO), "export": (job, env, REPO)}
            if args.compare_tree is not None:
                # Run from that tree: ``python -m`` imports from the working directory first.
                commands["export, compared tree"] = (
                    [*job[:-3], str(work / f"compared-{rep}"), *job[-2:]],
                    other_env,
                    other,
                )
            order = list(commands) if rep % 2 == 0 else list(reversed(commands))
            for side in order:
                command, side_env, cwd = commands[side]
                seconds, used = run_timed(command, side_env, cwd)
                timings[side].append(seconds)
                cpu[side].append(used)
                print(f"rep {rep + 1}: {side} {seconds:.1f} s, {used:.1f} s CPU", file=sys.stderr)
            seconds, used = run_timed(job, env)
            timings["no-op export"].append(seconds)
            cpu["no-op export"].append(used)
            print(f"rep {rep + 1}: no-op export {seconds:.1f} s, {used:.1f} s CPU", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        with psycopg.connect(args.server_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {db_name} WITH (FORCE)")
    ratios = {
        side: [r / e for r, e in zip(timings["reference"], timings[side], strict=True)]
        for side in timings
        if side.startswith("export")
    }
    print(f"\n{args.rows:,} archive rows, Spark {args.master}, {args.repeat} repetitions, "
          "whole commands (process start to exit); load average (1/5/15 min) at the end: "
          + "/".join(f"{x:.1f}" for x in os.getloadavg()) + "\n")  # fmt: skip
    print("| side | seconds (median) | rows/s | x reference, median (min-max) | CPU s (median) |")
    print("|---|---:|---:|---:|---:|")
    for side, values in timings.items():
        median = statistics.median(values)
        rate = f"{args.rows / median:,.0f}" if side != "no-op export" else "-"
        ratio = ""
        if side in ratios:
            values = ratios[side]
            ratio = f"**{statistics.median(values):.2f}x** ({min(values):.2f}-{max(values):.2f})"
        # Spark's JVM is not waited for by the export process: its CPU is not in the count.
        used = "-" if side in ratios else f"{statistics.median(cpu[side]):.1f}"
        print(f"| {side} | {median:.1f} | {rate} | {ratio} | {used} |")
    return 0
