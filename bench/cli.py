"""``python -m bench``: run the scenarios, print the tables, write results and plots.

The other benches are subcommands (``python -m bench <name> --help`` for their options):

mvcc       speed that lasts: sustained load, a held snapshot, the export, a big backlog and
           many workers on a private cluster with autovacuum on
flow       what fairness and limits cost, and what they buy a light tenant
compose    what dependencies and batches cost plain queues, batch drains, chain gaps
tracing    what message headers and OpenTelemetry tracing cost enqueue and a worker drain
pipeline   the Spark export and bulk enqueue against raw psycopg COPY
export     whole export commands, Spark start-up included, against a one-process COPY
processes  pgq_worker --processes: CPU-bound handlers on 1, 2, 4 processes; the supervisor's cost
publish    docs/benchmarks.md from a finished run's folder
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable

from . import core_cases, raw, report, scenarios, workers
from .config import MODES, PAYLOAD_BYTES
from .context import BENCH_DIR, Context, draw_plots, harness, peers_with_venvs, results_dir
from .measure import Recorder
from .peers import runner as peer_runner
from .pg import SERVER_DSN, StatsProbe, drop_database

Scenario = Callable[[Context, int], None]

ALL_PEERS = ["pgqueuer", "procrastinate", "tasksdb", "celery"]

# Subcommand -> the module whose main(argv) runs it (imported only when asked for).
SUBCOMMANDS = {
    "mvcc": "bench.mvcc_cli",
    "flow": "bench.flow_control_bench",
    "compose": "bench.composition_bench",
    "tracing": "bench.tracing_bench",
    "pipeline": "bench.pipeline_bench",
    "export": "bench.export_bench",
    "processes": "bench.processes_bench",
    "publish": "bench.publish",
}

# Long scenarios measured in the first repetition only (the memory run also runs once,
# right after it, so that an interrupted run still has it).
ONCE = {"steady"}


def scenario_table(ctx: Context) -> dict[str, list[Scenario]]:
    worker_ok = workers.available()
    table: dict[str, list[Scenario]] = {
        "enqueue": [scenarios.enqueue],
        "drain": [scenarios.drain],
        "claim": [scenarios.claim],
        "producers": [scenarios.producers],
        "latency": [],
        "steady": [],
        "memory": [],
    }
    if worker_ok:
        table["drain"].append(workers.drain)
        table["latency"].append(workers.latency)
        table["steady"].append(workers.steady)
    if ctx.peers:
        table["enqueue"].append(peer_runner.enqueue)
        table["drain"].append(peer_runner.drain)
        table["latency"].append(peer_runner.latency)
    return table


def _commit() -> str:
    """The checkout measured: its short commit id, ``+`` when it has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=BENCH_DIR,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=BENCH_DIR,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def machine_facts(probe: StatsProbe) -> dict[str, object]:
    def first(path: str, prefix: str) -> str:
        """What follows ``prefix`` on its first line in ``path``, or ""."""
        try:
            with open(path) as lines:
                return next((line[len(prefix) :] for line in lines if line.startswith(prefix)), "")
        except OSError:
            return ""

    mem_kib = int((first("/proc/meminfo", "MemTotal:").split() or ["0"])[0])
    cpu = first("/proc/cpuinfo", "model name").partition(":")[2].strip()
    import django
    import psycopg

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "postgres": probe.settings(),
        "payload_bytes": PAYLOAD_BYTES,
        "loadavg_start": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SUBCOMMANDS:
        run: Callable[[list[str]], int] = importlib.import_module(SUBCOMMANDS[argv[0]]).main
        return run(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--mode", choices=sorted(MODES), default="full")
    parser.add_argument("--quick", action="store_const", const="quick", dest="mode")
    parser.add_argument("--only", default="", help="comma-separated scenarios")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dsn", default=SERVER_DSN)
    parser.add_argument("--db", default="pgq_bench")
    parser.add_argument("--peers", default=",".join(ALL_PEERS))
    parser.add_argument("--no-peers", action="store_const", const="", dest="peers")
    parser.add_argument("--out", default="")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)

    sizes = MODES[args.mode]
    out_dir = results_dir(args.out, sizes.name)
    peers = peers_with_venvs(args.peers)
    results_path = out_dir / "results.jsonl"
    results_path.unlink(missing_ok=True)
    recorder = Recorder(str(results_path), quiet=args.quiet)
    started = time.time()
    failures: list[str] = []
    try:
        with harness(args.dsn, args.db, sizes, out_dir, peers, recorder) as ctx:
            raw.create_schema(ctx.dsn)
            table = scenario_table(ctx)
            wanted = [s for s in args.only.split(",") if s] or list(table)
            if unknown := set(wanted) - set(table):
                parser.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(table)}")
            if not workers.available():
                print(
                    "!! no pgq_worker in this checkout: worker scenarios skipped", file=sys.stderr
                )
            facts = machine_facts(ctx.probe)
            facts.update(
                mode=sizes.name,
                reps=args.reps,
                only=args.only,
                peers=peers,
                failures=failures,
                peer_versions=peer_runner.versions(peers),
                seconds=0,
                commit=_commit(),
            )
            # Written now too, so that an interrupted run still has what bench.publish needs.
            (out_dir / "facts.json").write_text(json.dumps(facts, indent=2))
            run_scenarios(ctx, args.reps, [(name, table[name]) for name in wanted], failures)
    finally:
        if not args.keep_db:
            drop_database(args.dsn, args.db)

    facts["seconds"] = round(time.time() - started)
    facts["loadavg_end"] = os.getloadavg()
    (out_dir / "facts.json").write_text(json.dumps(facts, indent=2))
    results = [json.loads(line) for line in results_path.read_text().splitlines() if line]
    markdown = report.full_report(results)
    (out_dir / "report.md").write_text(markdown)
    print(f"\n{markdown}")
    if failures:
        print("Failures:\n- " + "\n- ".join(failures))
    if not args.no_plots:
        draw_plots("plots.py", out_dir)
    print(f"results: {out_dir}")
    return 1 if failures else 0


def run_scenarios(
    ctx: Context, reps: int, wanted: list[tuple[str, list[Scenario]]], failures: list[str]
) -> None:
    """Every repetition of the scenarios; one that fails is noted in ``failures`` and the run
    goes on (one broken case must not lose the whole run)."""

    def attempt(label: str, scenario: Scenario, rep: int) -> None:
        print(f"== rep {rep}: {label}", flush=True)
        try:
            scenario(ctx, rep)
        except Exception as exc:
            failures.append(f"rep {rep} {label}: {type(exc).__name__}: {exc}")
            print(f"!! {failures[-1]}", file=sys.stderr, flush=True)
            core_cases.close_connections()

    for rep in range(reps):
        for name, scenarios_of in wanted:
            if name in ONCE and rep > 0:
                continue
            for scenario in scenarios_of:
                attempt(
                    f"{scenario.__module__.rsplit('.', 1)[-1]}.{scenario.__name__}", scenario, rep
                )
        if rep == 0 and "memory" in dict(wanted) and workers.available():
            attempt("memory: long run", workers.memory_long, 0)
