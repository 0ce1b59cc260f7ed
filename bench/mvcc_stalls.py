"""Latency stalls of a ``bench.mvcc_cli`` run set against what the server did at the time:
checkpoints and autovacuum runs, read from the cluster's log (kept as ``postgresql.log`` in
the run's folder; every autovacuum run is logged there, checkpoints by default).

    python -m bench.mvcc_stalls bench/results/<run> [--scenario sustained] [--over 500]
                                                    [--near 5]

A stall is a spell of messages whose enqueue -> start latency is over ``--over`` ms (spells
less than a second apart are one); it lasts from the first of them enqueued to the last
started. For each stall: the checkpoint start or sync phase, or the autovacuum run of one of
the system's tables, it overlaps, with ``--near`` seconds of slack. Beside the count, the
share of the run's time those windows cover: what chance alone would give.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \w+)"
_LINE = re.compile(_STAMP + r" \[\d+\] (?:\S+ )?LOG:\s+(.*)")
_SYNC = re.compile(r"sync=([\d.]+) s")
_TOTAL = re.compile(r"total=([\d.]+) s")
_ELAPSED = re.compile(r"elapsed: ([\d.]+) s")
_TABLE = re.compile(r'automatic (vacuum|analyze) of table "(?:[^".]+\.)*([^".]+)"')


@dataclass(frozen=True)
class ServerEvent:
    """Something the server did, from ``start`` to ``end`` (epoch seconds)."""

    kind: str  # "checkpoint start", "checkpoint sync", "vacuum" or "analyze"
    start: float
    end: float
    detail: str


@dataclass(frozen=True)
class Stall:
    """Messages over the threshold: from the first enqueued to the last started (run time)."""

    start: float
    end: float
    peak_ms: float
    messages: int


def _epoch(stamp: str) -> float:
    day, clock, zone = stamp.split(" ")
    if zone != "UTC":  # the bench's clusters log in the machine's zone
        raise ValueError(f"a log stamp in {zone}: only UTC is read")
    return datetime.fromisoformat(f"{day}T{clock}+00:00").timestamp()


def server_events(log: str) -> list[ServerEvent]:
    """Checkpoints' starts and sync phases, and autovacuum runs, of a PostgreSQL 15 log (UTC
    stamps)."""
    events: list[ServerEvent] = []
    entries: list[tuple[float, str]] = []
    for line in log.splitlines():
        match = _LINE.match(line)
        if match:
            entries.append((_epoch(match.group(1)), match.group(2)))
        elif entries and line.startswith(("\t", " ")):
            at, text = entries[-1]
            entries[-1] = (at, f"{text} {line.strip()}")
    for at, text in entries:
        if text.startswith("checkpoint starting"):
            # Every page's first change after it is written whole to the WAL.
            events.append(ServerEvent("checkpoint start", at, at, text.split(": ", 1)[-1]))
        if text.startswith("checkpoint complete"):
            sync = _SYNC.search(text)
            total = _TOTAL.search(text)
            seconds = float(sync.group(1)) if sync else 0.0
            events.append(
                ServerEvent(
                    "checkpoint sync",
                    at - seconds,
                    at,
                    f"total {float(total.group(1)) if total else 0:.1f} s",
                )
            )
        table = _TABLE.search(text)
        if table:
            elapsed = _ELAPSED.search(text)
            seconds = float(elapsed.group(1)) if elapsed else 0.0
            events.append(ServerEvent(table.group(1), at - seconds, at, table.group(2)))
    return events


def stalls(latency: list[list[float]], over_ms: float) -> list[Stall]:
    """Spells of messages started later than ``over_ms`` after their enqueue."""
    late = sorted((t, ms) for t, ms in latency if ms > over_ms)
    spells: list[list[tuple[float, float]]] = []
    for t, ms in late:
        if spells and t - spells[-1][-1][0] < 1.0:
            spells[-1].append((t, ms))
        else:
            spells.append([(t, ms)])
    return [
        Stall(
            start=min(t - ms / 1000 for t, ms in spell),
            end=spell[-1][0],
            peak_ms=max(ms for _, ms in spell),
            messages=len(spell),
        )
        for spell in spells
    ]


def aligned_t0(run: dict[str, Any], events: list[ServerEvent]) -> float | None:
    """The epoch second the run's series count from: recorded by the run, or else narrowed
    down from its samples' autovacuum counts of the live table against the log's runs (the
    count at time t is the number of runs ended by t0 + t); the middle of what fits."""
    if run.get("t0"):
        return float(run["t0"])
    table = run["live_table"]
    ends = sorted(e.end for e in events if e.kind == "vacuum" and e.detail == table)
    low, high = float("-inf"), float("inf")
    for sample in run["samples"]:
        count = sample["tables"].get(table, {}).get("autovacuums")
        if count is None or count > len(ends):
            continue
        if count > 0:
            low = max(low, ends[count - 1] - sample["t"])
        if count < len(ends):
            high = min(high, ends[count] - sample["t"])
    if low == float("-inf") or high == float("inf") or low > high:
        return None
    return (low + high) / 2


def _overlaps(stall: Stall, event: ServerEvent, t0: float, near: float) -> bool:
    return event.start - near <= t0 + stall.end and t0 + stall.start <= event.end + near


def _covered(events: list[ServerEvent], t0: float, seconds: float, near: float) -> float:
    """The share of the run's seconds within ``near`` of one of ``events``."""
    covered = 0
    for second in range(int(seconds)):
        at = t0 + second
        if any(e.start - near <= at <= e.end + near for e in events):
            covered += 1
    return covered / max(1, int(seconds))


def report(run: dict[str, Any], log: str, over_ms: float, near: float) -> str:
    # The system's own tables (those the run sampled), not the catalogs or another system's.
    tables = {name for sample in run["samples"] for name in sample["tables"]}
    events = [
        e for e in server_events(log) if e.kind.startswith("checkpoint") or e.detail in tables
    ]
    t0 = aligned_t0(run, events)
    found = stalls(run["latency"], over_ms)
    lines = [f"### {run['system']}: stalls over {over_ms:,.0f} ms\n"]
    if t0 is None:
        return "\n".join([*lines, "The run's time could not be set against the log.\n"])
    source = "recorded" if run.get("t0") else "aligned from autovacuum counts"
    lines.append(f"Run time 0 = {datetime.fromtimestamp(t0, UTC).isoformat()} ({source}).\n")
    lines.append(f"| at s | lasted s | peak ms | messages over | overlapping (±{near:g} s) |")
    lines.append("|--:|--:|--:|--:|---|")
    kinds = ("checkpoint start", "checkpoint sync", "vacuum", "analyze")
    hits = dict.fromkeys(kinds, 0)
    for stall in found:
        close = [e for e in events if _overlaps(stall, e, t0, near)]
        for kind in kinds:
            hits[kind] += any(e.kind == kind for e in close)
        what = ", ".join(f"{e.kind} {e.detail} ({e.end - e.start:.1f} s)" for e in close)
        lines.append(
            f"| {stall.start:,.0f} | {stall.end - stall.start:.1f} | {stall.peak_ms:,.0f} "
            f"| {stall.messages:,} | {what or '-'} |"
        )
    lines.append("")
    seconds = float(run["seconds"])
    for kind in kinds:
        share = _covered([e for e in events if e.kind == kind], t0, seconds, near)
        lines.append(
            f"- {kind}: {hits[kind]} of {len(found)} stalls overlap one; its windows "
            f"(±{near:g} s) cover {share:.0%} of the run"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="a finished bench.mvcc_cli run")
    parser.add_argument("--scenario", default="sustained", help="sustained, snapshot, export")
    parser.add_argument("--over", type=float, default=500.0, help="ms of enqueue -> start")
    parser.add_argument("--near", type=float, default=5.0, help="seconds of slack")
    args = parser.parse_args()
    results = json.loads((args.folder / "mvcc.json").read_text())
    log = (args.folder / "postgresql.log").read_text()
    for run in results.get(args.scenario, []):
        print(report(run, log, args.over, args.near))


if __name__ == "__main__":
    main()
