"""PNG plots from a results folder (run with matplotlib: bench/.venvs/plots).

python bench/plots.py bench/results/<run>   ->   <run>/bench-*.png
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.report import paired_ratio

Row = dict


def _groups(results: list[Row], scenario: str) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = defaultdict(list)
    for r in results:
        if r["scenario"] == scenario:
            groups[r["key"]].append(r)
    return groups


def _label(row: Row) -> str:
    return f"{row['system']}: {row['variant']}"


def ratio_bars(results: list[Row], scenario: str, title: str, ref_name: str, out: Path) -> None:
    rows = []
    for key, group in _groups(results, scenario).items():
        ratios = [x for g in group if (x := paired_ratio(results, g)) is not None]
        if key == group[0].get("ref") or (not ratios and any(r.get("ref") == key for r in results)):
            ratios = [1.0]
        if not ratios:
            continue
        rates = [g["rate"] for g in group if g.get("rate")]
        rows.append(
            (
                _label(group[0]),
                statistics.median(ratios),
                min(ratios),
                max(ratios),
                statistics.median(rates) if rates else 0,
                group[0]["system"],
            )
        )
    if not rows:
        return
    rows.sort(key=lambda r: r[1])
    colors = {"raw psycopg": "#888888", "django-pgqueue": "#1f77b4"}
    fig, ax = plt.subplots(figsize=(12, 0.42 * len(rows) + 1.6))
    y = range(len(rows))
    med = [r[1] for r in rows]
    err = [[r[1] - r[2] for r in rows], [r[3] - r[1] for r in rows]]
    ax.barh(list(y), med, xerr=err, color=[colors.get(r[5], "#ff7f0e") for r in rows], capsize=3)
    ax.set_yticks(list(y), [r[0] for r in rows], fontsize=8)
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    for i, r in enumerate(rows):
        ax.text(r[3] * 1.05, i, f"{r[1]:.2f}\u00d7 ({r[4]:,.0f}/s)", va="center", fontsize=7)
    ax.set_xlabel(f"\u00d7 {ref_name} (same repetition; median, min\u2013max; log)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def latency_bars(results: list[Row], out: Path) -> None:
    groups = _groups(results, "latency")
    if not groups:
        return
    labels, p50, p99 = [], [], []
    for group in groups.values():
        labels.append(f"{group[0]['system']}\n{group[0]['variant']}")
        p50.append(statistics.median(g["extra"]["p50_ms"] for g in group))
        p99.append(statistics.median(g["extra"]["p99_ms"] for g in group))
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(labels) + 1.6))
    y = list(range(len(labels)))
    ax.barh([i + 0.2 for i in y], p50, height=0.4, label="p50")
    ax.barh([i - 0.2 for i in y], p99, height=0.4, label="p99")
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xscale("log")
    for line, name in ((2.0, "target p50 2 ms"), (5.0, "target p99 5 ms")):
        ax.axvline(line, linestyle="--", color="grey", linewidth=0.8)
        ax.text(line, len(labels) - 0.4, name, fontsize=7, rotation=90, va="top")
    ax.set_xlabel("enqueue call \u2192 handler start, ms (median over repetitions; log scale)")
    ax.set_title("Idle latency at a 50/s trickle")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def rss_plot(results: list[Row], out: Path) -> None:
    longs = [r for r in results if r["key"] == "pgq.worker.rss_long"]
    if not longs:
        return
    series = longs[0]["extra"]["series"]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot([d for d, _ in series], [rss / 1024 for _, rss in series])
    ax.set_xlabel("messages processed")
    ax.set_ylabel("worker RSS, MiB")
    ax.set_ylim(bottom=0)
    ax.set_title(
        f"{longs[0]['variant']}\nRSS over the run: slope "
        f"{longs[0]['extra']['slope_kib_per_100k']:.0f} KiB per 100,000 messages after warm-up",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def steady_plot(results: list[Row], out: Path) -> None:
    rows = [r for r in results if r["key"] == "pgq.steady"]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(9, 4))
    for r in rows:
        series = r["extra"]["series"]
        ax.plot(
            [t for t, _, _ in series],
            [lag for _, _, lag in series],
            label=f"repetition {r['rep']}",
            linewidth=0.8,
        )
    ax.set_xlabel("seconds")
    ax.set_ylabel("age of the oldest ready message, ms")
    ax.set_title(f"Steady state: {rows[0]['variant']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    folder = Path(sys.argv[1])
    results = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines() if x]
    ratio_bars(
        results,
        "drain",
        "Processing: drain a backlog (no-op handlers)",
        "raw lease-then-archive, batch 100",
        folder / "bench-drain.png",
    )
    ratio_bars(
        results,
        "enqueue",
        "Enqueue",
        "the raw reference (INSERT [+ NOTIFY] + commit, or COPY)",
        folder / "bench-enqueue.png",
    )
    latency_bars(results, folder / "bench-latency.png")
    rss_plot(results, folder / "bench-rss.png")
    steady_plot(results, folder / "bench-steady.png")
    print(f"plots: {folder}/bench-*.png")


if __name__ == "__main__":
    main()
