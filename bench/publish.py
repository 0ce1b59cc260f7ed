"""Write docs/benchmarks.md and docs/img/bench-*.png from one results folder.

    python -m bench publish bench/results/<run> [--summary bench/summary.md] [--docs-dir docs]

The page is regenerated from the run's own files (results.jsonl, facts.json, plots), so the
numbers in the docs are always the ones a run printed. ``--summary`` is the hand-written
"What the numbers say" section; its ``{placeholders}`` are filled with the run's figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .context import REPO_DIR

# docs/benchmarks.md, its figures filled in by str.format() (literal braces doubled).
PAGE = Path(__file__).with_name("benchmarks_page.md")
# The run's sizes the page quotes, by their names in config.Sizes.
SIZES_QUOTED = (
    "claim_big claim_measured producers rss_n enqueue_n bulk_n drain_n drain_mid_n drain_slow_n"
    " peer_slow_n latency_n"
).split()


def _summary(values: list[float], unit: str = "\u00d7", digits: int = 2) -> str:
    if not values:
        return "not measured"
    med = statistics.median(values)
    return f"{med:.{digits}f}{unit} ({min(values):.{digits}f}\u2013{max(values):.{digits}f})"


def notes_values(results: list[dict[str, Any]]) -> dict[str, str]:
    """The figures the hand-written notes quote, taken from the run itself."""
    from .report import TARGETS, paired_ratio

    def extra(key: str, name: str) -> str:
        values = [r["extra"][name] for r in results if r["key"] == key and name in r["extra"]]
        return _summary(values, " ms", 1)

    notify = [r for r in results if r["key"] == "raw.producers_notify"]
    raw_notify = [x for r in notify if (x := paired_ratio(results, r)) is not None]
    rss = next((r for r in results if r["key"] == "pgq.worker.rss_long"), None)
    steady = [r for r in results if r["key"] == "pgq.steady"]
    values = {
        t.note: _summary(t.values(results), *(("\u00d7", 2) if t.unit == "\u00d7" else (" ms", 1)))
        for t in TARGETS
        if t.note
    }
    values |= {
        "raw_notify": _summary(raw_notify),
        "raw_p50": extra("raw.latency", "p50_ms"),
        "raw_p99": extra("raw.latency", "p99_ms"),
        "rss": (
            f"{rss['extra']['rss_warm_mib']:.1f} \u2192 {rss['extra']['rss_end_mib']:.1f} MiB, "
            f"{rss['extra']['slope_kib_per_100k']:.0f} KiB per 100,000 messages"
            if rss
            else "not measured"
        ),
        "steady": (
            f"{statistics.median(r['extra']['offered_rate'] for r in steady):,.0f} messages/s "
            f"offered and {statistics.median(r['rate'] for r in steady):,.0f}/s processed; "
            f"lag p99 {statistics.median(r['extra']['lag_p99_ms'] for r in steady):.1f} ms, "
            f"end-to-end p99 {statistics.median(r['extra']['p99_ms'] for r in steady):.1f} ms"
            if steady
            else "not measured"
        ),
    }
    return values


def _load(facts: dict[str, Any]) -> str:
    """The load average (1, 5, 15 minutes) when the run started, and when it ended if known."""
    start = ", ".join(f"{x:.1f}" for x in facts["loadavg_start"])
    if "loadavg_end" not in facts:
        return f"{start} when the run started"
    end = ", ".join(f"{x:.1f}" for x in facts["loadavg_end"])
    return f"{start} when the run started, {end} when it ended"


def run_command(facts: dict[str, Any], reps: int) -> str:
    """The command that repeats the run: its mode, repetitions, scenarios and peers."""
    words = ["bash bench/run.sh"]
    if facts["mode"] != "full":
        words.append("--quick" if facts["mode"] == "quick" else f"--mode {facts['mode']}")
    if reps != 3:
        words.append(f"--reps {reps}")
    if facts.get("only"):
        words.append(f"--only {facts['only']}")
    peers = facts.get("peers")
    if peers == []:
        words.append("--no-peers")
    elif peers and sorted(peers) != sorted(["pgqueuer", "procrastinate", "tasksdb", "celery"]):
        words.append(f"--peers {','.join(peers)}")
    return " ".join(words)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench publish")
    parser.add_argument("folder")
    parser.add_argument("--summary", default="", help="the hand-written notes (a template)")
    parser.add_argument("--docs-dir", default=str(REPO_DIR / "docs"), help="where to write")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    facts = json.loads((folder / "facts.json").read_text())
    from .report import detail_tables, summary_table

    results = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines() if x]
    reps_done = len({r["rep"] for r in results if r["scenario"] == "drain"})
    notes = Path(args.summary).read_text() if args.summary else ""
    if notes:
        notes = notes.format(**notes_values(results))
    pg = facts["postgres"]
    pg_settings = ", ".join(f"{k}={v}" for k, v in sorted(pg.items()) if k != "server_version")
    failures = ""
    if facts.get("failures"):
        failures = (
            "Cases that failed in this run (not in the tables):\n\n"
            + "\n".join(f"- {f}" for f in facts["failures"])
            + "\n"
        )
    from .config import MODES

    sizes = MODES[facts["mode"]]
    page = PAGE.read_text().format(
        payload=facts["payload_bytes"],
        load=_load(facts),
        summary_table=summary_table(results),
        notes=notes,
        command=run_command(facts, reps_done),
        mode=facts["mode"],
        reps=reps_done,
        minutes=round(facts["seconds"] / 60),
        date=datetime.fromtimestamp((folder / "results.jsonl").stat().st_mtime, UTC).strftime(
            "%Y-%m-%d %H:%M UTC"
        ),
        commit=facts.get("commit", "unknown"),
        details=detail_tables(results),
        failures=failures,
        cpu=facts["cpu"] or "unknown CPU",
        memory=facts["memory_gib"],
        pg_version=pg.get("server_version", "?"),
        pg_settings=pg_settings,
        **{name: facts[name] for name in ("nproc", "kernel", "python", "django", "psycopg")},
        peers=", ".join(f"{k} {v}" for k, v in facts.get("peer_versions", {}).items()) or "none",
        steady=f"{sizes.steady_seconds:g} ",
        slice_n=f"{sizes.drain_n // 5:,}",
        **{name: f"{getattr(sizes, name):,}" for name in SIZES_QUOTED},
    )
    docs = Path(args.docs_dir)
    (docs / "img").mkdir(parents=True, exist_ok=True)
    for png in sorted(folder.glob("bench-*.png")):
        shutil.copy(png, docs / "img" / png.name)
    (docs / "benchmarks.md").write_text(page)
    print(f"wrote {docs / 'benchmarks.md'}")
    return 0
