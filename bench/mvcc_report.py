"""Markdown tables of a ``bench.mvcc_cli`` run, with the issue's targets next to the ratios."""

from __future__ import annotations

import math
from typing import Any


def _f(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _ok(value: Any, limit: float, above: bool) -> str:
    """The value with a mark: ✓ when it meets the target, ✗ when not."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    good = value >= limit if above else value <= limit
    return f"{value:.2f} {'✓' if good else '✗'}"


def sustained_table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| system | worker | capacity/s | offered/s | first ¼ /s | last ¼ /s | last ÷ first "
        "(≥ 0.95) | p50 ms | p99 ms | dead tuples max | index MiB start → end "
        "| claim buffers/msg first → last | all its statements' buffers/msg first → last |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for run in runs:
        f = run["figures"]
        lines.append(
            f"| {run['system']} | {run['worker']} | {_f(f['capacity'])} | {_f(f['offered'])} "
            f"| {_f(f['rate_first'])} | {_f(f['rate_last'])} | {_ok(f['last_over_first'], 0.95, True)} "
            f"| {_f(f['p50_ms'], 1)} | {_f(f['p99_ms'], 1)} | {_f(f.get('dead_max'))} "
            f"| {_f(f.get('index_mib_start'), 1)} → {_f(f.get('index_mib_end'), 1)} "
            f"| {_f(f.get('buffers_per_msg_first'), 1)} → {_f(f.get('buffers_per_msg_last'), 1)} "
            f"| {_f(f.get('all_buffers_per_msg_first'), 1)} → "
            f"{_f(f.get('all_buffers_per_msg_last'), 1)} |"
        )
    return "\n".join(lines)


def snapshot_table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| system | offered/s (load) | before /s | during /s | during ÷ before (≥ 0.95) "
        "| backlog max during ÷ 10 s of load (≤ 1) | claim buffers/msg calm → during "
        "| ratio (≤ 3) | all its statements' buffers/msg calm → during "
        "| p99 ms before → during | ratio (≤ 3) | recovery s (≤ 30) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for run in runs:
        f = run["figures"]
        what = run["system"] + (" + pgq_pipeline export" if run.get("export") else "")
        lines.append(
            f"| {what} | {_f(f['offered'])} ({run['load']:.0%}) | {_f(f['rate_before'])} "
            f"| {_f(f['rate_during'])} | {_ok(f['during_over_before'], 0.95, True)} "
            f"| {_ok(f['backlog_max_over_10s_load'], 1.0, False)} "
            f"| {_f(f['buffers_per_msg_calm'], 1)} → {_f(f['buffers_per_msg_during'], 1)} "
            f"| {_ok(f['buffers_ratio'], 3.0, False)} "
            f"| {_f(f['all_buffers_per_msg_calm'], 1)} → {_f(f['all_buffers_per_msg_during'], 1)} "
            f"| {_f(f['p99_before_ms'], 1)} → {_f(f['p99_during_ms'], 1)} "
            f"| {_ok(f['p99_ratio'], 3.0, False)} | {_ok(f['recovery_s'], 30.0, False)} |"
        )
    return "\n".join(lines)


def backlog_table(cases: list[dict[str, Any]]) -> str:
    lines = [
        "| queue | ready (big) | claim+complete/s with 1,000 ready | with big backlog "
        "| big ÷ 1,000 (≥ 0.9) | live table MiB |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for c in cases:
        queue = f"fair, {c['tenants']:,} tenants" if c["tenants"] else "plain"
        lines.append(
            f"| {queue} | {c['big']:,} | {_f(c['small_rate'])} | {_f(c['big_rate'])} "
            f"| {_ok(c['ratio'], 0.9, True)} | {_f(c['table_mib'])} |"
        )
    return "\n".join(lines)


def workers_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| pgq_worker processes (--concurrency 4) | messages | msgs/s | worker CPU ms/msg "
        "| server CPU ms/msg | connections (peak) |",
        "|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workers']} | {r['n']:,} | {_f(r['rate'])} | {_f(r['worker_cpu_ms_per_msg'], 3)} "
            f"| {_f(r['server_cpu_ms_per_msg'], 3)} | {r['connections_peak']} |"
        )
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    args = results["args"]
    pg = results.get("postgres", {})
    parts = [
        f"# MVCC pressure ({args['minutes']:g}-minute runs, private cluster: PostgreSQL "
        f"{pg.get('server_version', '?')}, autovacuum {pg.get('autovacuum', '?')}, "
        f"shared_buffers {pg.get('shared_buffers', '?')})",
        f"load average {results['loadavg_start']} → {results.get('loadavg_end')}, "
        f"{results.get('seconds', 0)} s in all",
    ]
    if results.get("sustained"):
        parts += ["## Sustained, 80% of capacity", sustained_table(results["sustained"])]
    if results.get("snapshot"):
        parts += [
            "## A REPEATABLE READ snapshot held over the middle half, 70% of capacity",
            snapshot_table(results["snapshot"]),
        ]
    if results.get("export"):
        parts += ["## pgq_pipeline export over the middle half", snapshot_table(results["export"])]
    if results.get("backlog"):
        parts += ["## Backlog scale", backlog_table(results["backlog"])]
    if results.get("workers"):
        parts += ["## Many workers", workers_table(results["workers"])]
    return "\n\n".join(parts) + "\n"
