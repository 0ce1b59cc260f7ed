"""Markdown tables of a ``python -m bench mvcc`` run, with the issue's targets next to the ratios."""

from __future__ import annotations

import math
from typing import Any

from .report import table

# As bench.scenarios.PGQ: mvcc_plots.py imports this module in the plots' virtualenv.
PGQ = "django-pgqueue"
PGQ_WORKER = "pgq_worker --concurrency 4"  # the label of a run saved without one

# Each table's column titles, joined by " | ".
HEADERS = {
    "sustained": (
        "system (worker) | capacity/s | offered/s | first ¼ /s | last ¼ /s"
        " | last ÷ first (≥ 0.95) | last ¼ ÷ offered | p50 ms | p99 ms | dead tuples max"
        " | live table's index MiB at ¼ · ½ · ¾ · end | claim buffers/msg first → last"
        " | all its statements' buffers/msg first → last"
    ),
    "snapshot": (
        "system | offered/s (load) | before /s | during /s"
        " | during ÷ before (≥ 0.95) | backlog max during ÷ 10 s of load (≤ 1)"
        " | claim buffers/msg calm → during | ratio (≤ 3)"
        " | all its statements' buffers/msg calm → during"
        " | p99 ms before → during | ratio (≤ 3) | recovery s (≤ 30)"
    ),
    "snapshot_cpu": (
        "system | machine busy calm → during (share of its cores)"
        " | worker CPU ms/msg calm → during | server CPU ms/msg calm → during"
    ),
    "backlog": (
        "system, queue (worker) | ready (big) | timed | claim+complete/s with 1,000 ready"
        " | with the big backlog | big ÷ 1,000 (≥ 0.9)"
        " | WAL KiB/msg 1,000 → big | full-page images/msg 1,000 → big | checkpoints (big)"
        " | head walk buffers 1,000 → big | live table MiB"
    ),
    "workers": (
        "system (worker) | processes | messages | msgs/s"
        " | worker CPU ms/msg | server CPU ms/msg | connections (peak)"
    ),
}


def offered_labels(args: dict[str, Any]) -> tuple[str, str]:
    """What the sustained and the snapshot runs offered: a share of capacity, or ``--rate``."""
    rate = args.get("rate")
    if rate:
        return f"{rate:,.0f} msgs/s", f"{rate:,.0f} msgs/s"
    return "80% of capacity", "70% of capacity"


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


def _span(a: Any, b: Any, digits: int = 1) -> str:
    return f"{_f(a, digits)} → {_f(b, digits)}"


def _sustained_row(run: dict[str, Any]) -> list[str]:
    f = run["figures"]
    return [
        f"{run['system']} ({run['worker']})",
        _f(f["capacity"]),
        _f(f["offered"]),
        _f(f["rate_first"]),
        _f(f["rate_last"]),
        _ok(f["last_over_first"], 0.95, True),
        # A system that never kept up with the offered load can still hold its own rate.
        _f(f["rate_last"] / f["offered"], 2),
        _f(f["p50_ms"], 1),
        _f(f["p99_ms"], 1),
        _f(f.get("dead_max")),
        " · ".join(_f(f.get(f"index_mib_q{q}"), 1) for q in (1, 2, 3, 4)),
        _span(f.get("buffers_per_msg_first"), f.get("buffers_per_msg_last")),
        _span(f.get("all_buffers_per_msg_first"), f.get("all_buffers_per_msg_last")),
    ]


def sustained_table(runs: list[dict[str, Any]]) -> str:
    return table(HEADERS["sustained"], [_sustained_row(run) for run in runs])


def _export_label(run: dict[str, Any]) -> str:
    every = run.get("export_every") or 0
    how = f"--every {every:g}, " if every else ""
    if run.get("export_max_ranges"):
        how += f"--max-ranges {run['export_max_ranges']}, "
    return (
        f" + pgq_pipeline export ({how}{run.get('export_runs', 0)} passes,"
        f" CPU {run.get('export_cpu', 'normal')})"
    )


def _snapshot_row(run: dict[str, Any]) -> list[str]:
    f = run["figures"]
    return [
        run["system"] + (_export_label(run) if run.get("export") else ""),
        f"{_f(f['offered'])} ({run['load']:.0%})",
        _f(f["rate_before"]),
        _f(f["rate_during"]),
        _ok(f["during_over_before"], 0.95, True),
        _ok(f["backlog_max_over_10s_load"], 1.0, False),
        _span(f["buffers_per_msg_calm"], f["buffers_per_msg_during"]),
        _ok(f["buffers_ratio"], 3.0, False),
        _span(f.get("all_buffers_per_msg_calm"), f.get("all_buffers_per_msg_during")),
        _span(f["p99_before_ms"], f["p99_during_ms"]),
        _ok(f["p99_ratio"], 3.0, False),
        _ok(f["recovery_s"], 30.0, False),
    ]


def snapshot_table(runs: list[dict[str, Any]]) -> str:
    return table(HEADERS["snapshot"], [_snapshot_row(run) for run in runs])


def _share(a: Any, b: Any) -> str:
    return " → ".join("-" if v is None or math.isnan(v) else f"{v:.0%}" for v in (a, b))


def snapshot_cpu_table(runs: list[dict[str, Any]]) -> str:
    """Where the CPU went, calm and during (the same windows as the buffers): on a small
    machine a queue that needs more CPU per message under a snapshot shows it in its tail."""
    rows = []
    for run in runs:
        f = run["figures"]
        rows.append(
            [
                run["system"],
                _share(f.get("machine_busy_calm"), f.get("machine_busy_during")),
                _span(
                    f.get("worker_cpu_ms_per_msg_calm"), f.get("worker_cpu_ms_per_msg_during"), 3
                ),
                _span(
                    f.get("server_cpu_ms_per_msg_calm"), f.get("server_cpu_ms_per_msg_during"), 3
                ),
            ]
        )
    return table(HEADERS["snapshot_cpu"], rows)


def _backlog_label(case: dict[str, Any]) -> str:
    """Ours by its queue (plain, fair), a peer by its worker. A run saved before the peers
    ran in this scenario has ours only, without a system."""
    system = case.get("system", PGQ)
    if case["tenants"]:
        return f"{system}, fair, {case['tenants']:,} tenants"
    if system == PGQ:
        return f"{system}, plain"
    return f"{system} ({case['worker']})"


def backlog_table(cases: list[dict[str, Any]]) -> str:
    header = HEADERS["backlog"]
    rows = [
        [
            _backlog_label(c),
            f"{c['big']:,}",
            f"{c.get('timed', c['measured']):,}",
            _f(c["small_rate"]),
            _f(c["big_rate"]),
            _ok(c["ratio"], 0.9, True),
            *_wal_cells(c.get("wal")),
            _head_cell(c.get("head_walk_buffers")),
            _f(c["table_mib"]),
        ]
        for c in cases
    ]
    return table(header, rows)


def _wal_cells(wal: dict[str, dict[str, float]] | None) -> list[str]:
    """What the server wrote per message in each timing; "-" where it was not counted."""
    if not wal:
        return ["-"] * 3
    small, big = wal["small"], wal["big"]
    return [
        _span(small["wal_kib_per_msg"], big["wal_kib_per_msg"]),
        _span(small["fpi_per_msg"], big["fpi_per_msg"], 2),
        str(int(big["checkpoints"])),
    ]


def _head_cell(buffers: dict[str, int] | None) -> str:
    """The buffers of a walk of the claim order's head after each timing; "-" when not read
    (a peer's, or a run saved before it was)."""
    if not buffers:
        return "-"
    return f"{buffers['small']:,} → {buffers['big']:,}"


def workers_table(rows: list[dict[str, Any]]) -> str:
    header = HEADERS["workers"]
    figures = (("rate", 0), ("worker_cpu_ms_per_msg", 3), ("server_cpu_ms_per_msg", 3))
    cells = [
        [
            f"{r.get('system', PGQ)} ({r.get('worker', PGQ_WORKER)})",
            str(r["workers"]),
            f"{r['n']:,}",
            *(_f(r[k], d) for k, d in figures),
            str(r["connections_peak"]),
        ]
        for r in rows
    ]
    return table(header, cells)


def markdown(results: dict[str, Any]) -> str:
    args = results["args"]
    pg = results.get("postgres", {})
    timed = any(results.get(name) for name in ("sustained", "snapshot", "export"))
    runs = f"{args['minutes']:g}-minute runs, " if timed else ""
    parts = [
        f"# MVCC pressure ({runs}private cluster: PostgreSQL "
        f"{pg.get('server_version', '?')}, autovacuum {pg.get('autovacuum', '?')}, "
        f"shared_buffers {pg.get('shared_buffers', '?')})",
        f"load average {results['loadavg_start']} → {results.get('loadavg_end')}, "
        f"{results.get('seconds', 0)} s in all",
    ]
    sustained, held = offered_labels(args)
    if results.get("sustained"):
        parts += [f"## Sustained, {sustained} offered", sustained_table(results["sustained"])]
    if results.get("snapshot"):
        parts += [
            f"## A REPEATABLE READ snapshot held over the middle half, {held} offered",
            snapshot_table(results["snapshot"]),
            "CPU, before the snapshot and over the last third of it:",
            snapshot_cpu_table(results["snapshot"]),
        ]
    if results.get("export"):
        parts += [
            "## pgq_pipeline export over the middle half",
            snapshot_table(results["export"]),
            "CPU, before the export and over the last third of its window:",
            snapshot_cpu_table(results["export"]),
        ]
    if results.get("backlog"):
        parts += ["## Backlog scale", backlog_table(results["backlog"])]
    if results.get("workers"):
        parts += ["## Many workers", workers_table(results["workers"])]
        if any(r.get("system") == "Procrastinate" for r in results["workers"]):
            parts.append(
                "Procrastinate, a few hundred jobs/s here, drains a twentieth of the others' "
                "messages (at least 1,000)."
            )
    return "\n\n".join(parts) + "\n"
