"""What the queue and the machine did, spell by spell, in one scenario of a ``python -m bench
mvcc`` run (the export's report): where a whole-window figure hides when something happened.

Each spell (``--spell`` seconds) gives: messages processed per second, enqueue -> start p50
and p99, the backlog's peak; the share of the machine's cores busy and idle in iowait; the
cores the cluster, the worker and the export used; what the disks wrote (MB/s) and the share
of the spell they had a request in flight; and the states the cluster's client backends were
seen in most (mean backends in each: ``running`` is on a CPU or waiting for one). Runs made
before the sampler read a figure show a dash for it.
"""

from __future__ import annotations

import os
from typing import Any

from .measure import percentile
from .mvcc import _between, _rate

WAITS_SHOWN = 3


def _delta(samples: list[dict[str, Any]], key: str) -> float | None:
    """The increase of a cumulative counter per second over the samples, or None."""
    have = [s for s in samples if key in s]
    if len(have) < 2 or have[-1]["t"] <= have[0]["t"]:
        return None
    return float(have[-1][key] - have[0][key]) / (have[-1]["t"] - have[0]["t"])


def _waits(samples: list[dict[str, Any]]) -> str:
    have = [s for s in samples if "waits" in s]
    if len(have) < 2:
        return "-"
    first, last = have[0], have[-1]
    looks = last["wait_looks"] - first["wait_looks"]
    if not looks:
        return "-"
    mean = {k: (v - first["waits"].get(k, 0)) / looks for k, v in last["waits"].items()}
    top = sorted(((v, k) for k, v in mean.items() if v > 0), reverse=True)[:WAITS_SHOWN]
    return " · ".join(f"{k} {v:.2f}" for v, k in top) or "none active"


def _share(value: float | None, cores: int = 1) -> str:
    return "-" if value is None else f"{value / cores:.2f}"


def spell_rows(run: dict[str, Any], spell: float) -> list[str]:
    cores = os.cpu_count() or 1
    window = (run["snapshot_at"], run["commit_at"]) if run.get("snapshot_at") else None
    latency = [(t, ms) for t, ms in run["latency"]]
    rows = []
    start = 0.0
    while start < run["seconds"]:
        end = min(start + spell, run["seconds"])
        samples = [s for s in run["samples"] if start <= s["t"] <= end]
        ms = _between(latency, start, end)
        inside = window is not None and window[0] < end and start < window[1]
        written = _delta(samples, "disk_written")
        rows.append(
            " | ".join(
                [
                    f"| {start / 60:g}-{end / 60:g}",
                    "yes" if inside else "",
                    f"{_rate(run['processed'], start, end):,.0f}",
                    f"{percentile(ms, 50):,.1f}",
                    f"{percentile(ms, 99):,.0f}",
                    f"{max(_between(run['backlog'], start, end), default=0):,}",
                    _share(_delta(samples, "machine_busy"), cores),
                    _share(_delta(samples, "machine_iowait"), cores),
                    _share(_delta(samples, "server_cpu")),
                    _share(_delta(samples, "worker_cpu")),
                    _share(_delta(samples, "export_cpu")),
                    "-" if written is None else f"{written / 1e6:,.1f}",
                    _share(_delta(samples, "disk_busy")),
                    f"{_waits(samples)} |",
                ]
            )
        )
        start = end
    return rows


def report(run: dict[str, Any], spell: float) -> str:
    lines = [
        f"### {run['system']}: by {spell:g}-second spell\n",
        "| minutes | window | processed/s | p50 ms | p99 ms | backlog max | machine busy "
        "| iowait | cluster cores | worker cores | export cores | disk written MB/s "
        "| disk busy | backends seen most (mean) |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
        *spell_rows(run, spell),
    ]
    return "\n".join(lines) + "\n"
