"""PNG plots of a ``python -m bench mvcc`` run (run with matplotlib: bench/.venvs/plots).

python bench/mvcc_plots.py bench/results/<run>-mvcc   ->   <run>/mvcc-<scenario>.png

One figure per offered-load scenario, every system on the same axes, against seconds since
the offered load began: processed/s and p99 enqueue -> start per 10 s, the backlog, dead
tuples and index size of the system's tables, and buffers per processed message of the claim
statement and (dashed) of all the system's statements.
"""

from __future__ import annotations

import bisect
import itertools
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.mvcc_report import offered_labels

BIN = 10.0  # seconds per throughput / latency point
# The table each system's claims read (runs saved before "live_table" was recorded).
LIVE_TABLES = {
    "pgq": "pgqueue_message",
    "pgqueuer": "pgqueuer",
    "procrastinate": "procrastinate_jobs",
}


def _rate(processed: list[float], seconds: float) -> dict[float, float]:
    """Messages processed per second in each bin, keyed by the bin's middle."""
    counts = Counter((t // BIN) * BIN + BIN / 2 for t in processed if 0 <= t < seconds)
    return {middle: n / BIN for middle, n in sorted(counts.items())}


def _binned(values: list[list[float]], seconds: float) -> dict[float, list[float]]:
    bins: dict[float, list[float]] = defaultdict(list)
    for t, v in values:
        if 0 <= t < seconds:
            bins[(t // BIN) * BIN + BIN / 2].append(v)
    return dict(sorted(bins.items()))


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def _per_interval(
    samples: list[dict[str, Any]], processed: list[float], counter: str
) -> list[tuple[float, float]]:
    """The counter's increase per message processed between each two samples; ``processed``
    sorted (an hour's run holds millions of times, so each interval is found by bisection)."""
    out = []
    for a, b in itertools.pairwise(samples):
        done = bisect.bisect_left(processed, b["t"]) - bisect.bisect_left(processed, a["t"])
        if done:
            out.append(((a["t"] + b["t"]) / 2, (b[counter] - a[counter]) / done))
    return out


def figure(runs: list[dict[str, Any]], title: str, out: Path) -> None:
    fig, axes = plt.subplots(6, 1, figsize=(10, 16), sharex=True)
    for run in runs:
        label = run["system"]
        end = run["produced_until"] + 30
        processed = sorted(run["processed"])
        rate = _rate(processed, end)
        axes[0].plot(list(rate), list(rate.values()), label=label)
        lat = _binned(run["latency"], end)
        axes[1].plot(list(lat), [_p99(v) for v in lat.values()], label=label)
        axes[2].plot([t for t, _ in run["backlog"]], [b for _, b in run["backlog"]], label=label)
        ts = [s["t"] for s in run["samples"]]
        axes[3].plot(ts, [sum(x["dead"] for x in s["tables"].values()) for s in run["samples"]])
        table = run.get("live_table") or LIVE_TABLES[run["key"]]
        live = [s["tables"].get(table, {}) for s in run["samples"]]
        axes[4].plot(ts, [x.get("index_bytes", 0) / 2**20 for x in live])
        per = _per_interval(run["samples"], processed, "claim_buffers")
        line = axes[5].plot([t for t, _ in per], [b for _, b in per], label=label)[0]
        every = _per_interval(run["samples"], processed, "system_buffers")
        axes[5].plot([t for t, _ in every], [b for _, b in every], ls="--", c=line.get_color())
        if run.get("snapshot_at") is not None:
            for ax in axes:
                ax.axvspan(run["snapshot_at"], run["commit_at"], color="grey", alpha=0.08)
    names = [
        "processed/s",
        "p99 enqueue→start (ms)",
        "backlog (ready + leased)",
        "dead tuples (its tables)",
        "live table's indexes (MiB)",
        "buffers / message\n(claim; dashed: all its statements)",
    ]
    for ax, name in zip(axes, names, strict=True):
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[5].set_yscale("log")
    axes[0].legend(loc="lower left")
    axes[-1].set_xlabel("seconds since the offered load began (shaded: snapshot / export held)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main() -> None:
    folder = Path(sys.argv[1])
    results = json.loads((folder / "mvcc.json").read_text())
    sustained, held = offered_labels(results["args"])
    titles = {
        "sustained": f"Sustained, {sustained} offered, autovacuum on",
        "snapshot": f"{held} offered, REPEATABLE READ snapshot held over the middle half",
        "export": f"{held} offered, pgq_pipeline export over the middle half",
    }
    for name, title in titles.items():
        if results.get(name):
            path = folder / f"mvcc-{name}.png"
            figure(results[name], title, path)
            print(f"plot: {path}")


if __name__ == "__main__":
    main()
