"""``python -m bench mvcc``: speed that lasts, on a private PostgreSQL cluster with the
server's defaults (autovacuum on), made for the run and removed at its end.

python -m bench mvcc [options]   (--help: every option)
python -m bench mvcc --report bench/results/<stamp>-mvcc

sustained  each system at 80% of its measured capacity (or --rate msgs/s) for --minutes
snapshot   the same at 70%, a REPEATABLE READ snapshot held over the middle half
export     ours at 70% with `pgq_pipeline export` (Spark) over the middle half: one
           `--every` process, a pass each --export-every seconds in one Spark session (0: a
           process per pass, back to back), each pass at most --export-max-ranges ranges of
           each source (0: all), at --export-cpu priority (idle: SCHED_IDLE; low: nice 19;
           background: a session of its own whose autogroup is at nice 19; normal), into a
           destination made under --export-under; its report goes on
           minute by minute (--report gives it again for a finished run)
backlog    claim rate with --backlog ready over 1,000 ready; and a fair queue of --tenants
           with --fair-backlog ready (--backlog 0: the fair queue alone); the peers' own
           workers with --backlog ready too
workers    1..16 worker processes draining --workers-n messages: rate, CPU, connections;
           pgq_worker, then each peer's (Procrastinate: --workers-n / 20, at least 1,000)

The peers (--peers) run in every scenario but export.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import mvcc, mvcc_report, mvcc_scale, mvcc_timeline
from .config import QUICK
from .context import Context, draw_plots, harness, peers_with_venvs, results_dir, stamp
from .measure import Recorder
from .private_server import enable_statements, private_server

DB = "pgq_mvcc"
ALL = ["sustained", "snapshot", "export", "backlog", "workers"]
DEFAULT = ["sustained", "snapshot", "backlog", "workers"]  # export: Spark, opt-in
LONG_MINUTES = 120.0
SMALL_READY = 1_000


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench mvcc",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--minutes", type=float, default=20.0, help="each offered-load run")
    add("--long", action="store_const", const=LONG_MINUTES, dest="minutes")
    add("--only", default=",".join(DEFAULT), help=f"of {','.join(ALL)}")
    add("--peers", default="pgqueuer,procrastinate")
    add("--no-peers", action="store_const", const="", dest="peers")
    add("--sample", type=float, default=10.0, help="seconds between samples")
    add("--capacity-n", type=int, default=10_000, help="per producer")
    add("--enqueue-batch", type=int, default=10, help="messages per call")
    add("--rate", type=float, default=0.0, help="offered msgs/s for all, instead of a share")
    add("--backlog", type=int, default=10_000_000, help="ready messages (0: no plain case)")
    add("--tenants", type=int, default=10_000, help="0: no fair case")
    add("--fair-backlog", type=int, default=0, help="default: --backlog")
    add("--claimed", type=int, default=20_000, help="claims timed per case")
    add("--workers", default="1,2,4,8,16")
    add("--workers-n", type=int, default=200_000)
    add("--out", default="")
    add(
        "--server-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of the private cluster (e.g. shared_buffers=4GB); repeatable",
    )
    add("--export-cpu", choices=sorted(mvcc.EXPORT_CPU), default="normal")
    add("--export-every", type=float, default=10.0)
    add("--export-max-ranges", type=int, default=0)
    add("--export-under", default="", metavar="DIR", help="default: the temporary folder")
    add("--no-plots", action="store_true")
    add("--report", default="", help="a finished run's folder: its tables and plots again")
    return parser  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.report:
        return report_again(Path(args.report), plots=not args.no_plots)
    wanted = [s for s in args.only.split(",") if s]
    unknown = set(wanted) - set(ALL)
    if unknown:
        _parser().error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(ALL)}")
    out_dir = results_dir(args.out, "mvcc")
    results: dict[str, Any] = {
        "args": vars(args),
        "peers": peers_with_venvs(args.peers),
        "started": stamp(),
        "loadavg_start": os.getloadavg(),
    }
    started = time.time()
    log = out_dir / "postgresql.log"
    name = f"pgq_bench_{os.getpid()}"
    with private_server(name, keep_log=log, settings=args.server_setting) as server_dsn:
        recorder = Recorder(None, quiet=True)
        with harness(server_dsn, DB, QUICK, out_dir, results["peers"], recorder) as ctx:
            enable_statements(ctx.dsn)
            results["postgres"] = ctx.probe.settings()
            run_scenarios(ctx, args, wanted, results, out_dir)
    results["seconds"] = round(time.time() - started)
    results["loadavg_end"] = os.getloadavg()
    _save(results, out_dir)
    write_report(results, out_dir)
    if not args.no_plots:
        draw_plots("mvcc_plots.py", out_dir)
    print(f"results: {out_dir}")
    return 0


def write_report(results: dict[str, Any], out_dir: Path) -> None:
    """``report.md``: the tables, and the export's runs minute by minute (what a window's
    figure hides: when the queue slowed, and what the machine did then)."""
    timelines = [mvcc_timeline.report(run, 60.0) for run in results.get("export", [])]
    markdown = "\n\n".join([mvcc_report.markdown(results), *timelines])
    (out_dir / "report.md").write_text(markdown)
    print(markdown)


def report_again(out_dir: Path, plots: bool) -> int:
    """The tables (and plots) of a saved run, its figures computed by this checkout."""
    results = json.loads((out_dir / "mvcc.json").read_text())
    for name in ("sustained", "snapshot", "export"):
        for run in results.get(name, []):
            run["figures"] = mvcc.figures(run)
    _save(results, out_dir)
    write_report(results, out_dir)
    if plots:
        draw_plots("mvcc_plots.py", out_dir)
    return 0


def _save(results: dict[str, Any], out_dir: Path) -> None:
    (out_dir / "mvcc.json").write_text(json.dumps(results, default=float))


def run_scenarios(
    ctx: Context, args: argparse.Namespace, wanted: list[str], results: dict[str, Any], out: Path
) -> None:
    seconds = args.minutes * 60
    base = mvcc.Plan(
        seconds=seconds,
        sample=args.sample,
        load=0.8,
        snapshot=False,
        capacity_n=args.capacity_n,
        enqueue_batch=args.enqueue_batch,
        rate=args.rate,
    )
    systems = ["pgq", *ctx.peers]
    plans = {
        "sustained": base,
        "snapshot": replace(base, load=0.7, snapshot=True),
    }
    for name in ("sustained", "snapshot"):
        if name not in wanted:
            continue
        for system in systems:
            print(f"== {name}: {system} ({args.minutes:g} min)", flush=True)
            run = mvcc.run_system(ctx, system, plans[name])
            results.setdefault(name, []).append(run)
            _save(results, out)
            print(f"   {json.dumps(_rounded(run['figures']))}", flush=True)
    if "export" in wanted:
        print(f"== export: pgq ({args.minutes:g} min)", flush=True)
        under = args.export_under or None
        with tempfile.TemporaryDirectory(prefix="pgq-mvcc-export-", dir=under) as destination:
            plan = replace(
                base,
                load=0.7,
                export_dir=Path(destination),
                export_cpu=args.export_cpu,
                export_every=args.export_every,
                export_max_ranges=args.export_max_ranges,
            )
            results["export"] = [mvcc.run_system(ctx, "pgq", plan)]
        _save(results, out)
    if "backlog" in wanted:
        run_backlog(ctx, args, results, out)
    if "workers" in wanted:
        run_workers(ctx, args, results, out)


def run_backlog(ctx: Context, args: argparse.Namespace, results: dict[str, Any], out: Path) -> None:
    """Ours with --backlog ready (plain) and --fair-backlog (fair); then each peer with
    --backlog ready. --backlog 0 runs the fair case alone, --tenants 0 no fair case."""
    cases = []  # (tenants, ready)
    if args.backlog:
        cases.append((0, args.backlog))
    fair_backlog = args.fair_backlog or args.backlog
    if args.tenants and fair_backlog:
        cases.append((args.tenants, fair_backlog))
    for tenants, big in cases:
        print(f"== backlog: {big:,} ready, {tenants:,} tenants", flush=True)
        case = mvcc_scale.backlog(ctx, big, SMALL_READY, min(args.claimed, big), tenants)
        _add(results, "backlog", [case], out)
    if not args.backlog:
        return
    measured = min(args.claimed, args.backlog)
    for name in ctx.peers:
        print(f"== backlog: {name}, {args.backlog:,} ready", flush=True)
        case = mvcc_scale.peer_backlog(ctx, name, args.backlog, SMALL_READY, measured)
        _add(results, "backlog", [case], out)


def run_workers(ctx: Context, args: argparse.Namespace, results: dict[str, Any], out: Path) -> None:
    counts = [int(c) for c in args.workers.split(",") if c]
    print(f"== workers: {counts}, {args.workers_n:,} messages", flush=True)
    _add(results, "workers", mvcc_scale.many_workers(ctx, counts, args.workers_n), out)
    for name in ctx.peers:
        print(f"== workers: {name}, {counts}", flush=True)
        _add(results, "workers", mvcc_scale.peer_workers(ctx, name, counts, args.workers_n), out)


def _add(results: dict[str, Any], name: str, rows: list[dict[str, Any]], out: Path) -> None:
    """Rows of a scenario kept and saved at once (a long run keeps what it has done)."""
    results.setdefault(name, []).extend(rows)
    _save(results, out)
    for row in rows:
        print(f"   {json.dumps(_rounded(row))}", flush=True)


def _rounded(values: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in values.items()}
