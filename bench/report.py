"""From result records to markdown: rates with ratios, latency, memory, steady state, and
the targets with a plain "met?" column. Ratios are computed inside each repetition, then
summarised as median (min-max) over the repetitions."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]

SCENARIO_ORDER = ["enqueue", "drain", "claim", "producers", "latency", "steady", "memory"]


def table(header: str, rows: list[list[str]], left: int = 1) -> str:
    """A markdown table (``header``: the titles joined by " | "): the first ``left`` columns
    left-aligned, the rest right-aligned."""
    columns = header.count(" | ") + 1
    lines = [f"| {header} |", "|" + "---|" * left + "---:|" * (columns - left)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _by_key(results: Iterable[Row]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = defaultdict(list)
    for r in results:
        groups[r["key"]].append(r)
    return groups


def _rate_in_rep(results: list[Row], key: str, rep: int) -> float | None:
    for r in results:
        if r["key"] == key and r["rep"] == rep and r.get("rate"):
            return float(r["rate"])
    return None


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _fmt_small(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 10:
        return f"{value:,.1f}"
    if value >= 0.1:
        return f"{value:.2f}"
    return f"{value:.4f}"


def _summary(values: list[float], digits: int = 0) -> tuple[str, str]:
    if not values:
        return "—", "—"
    med = statistics.median(values)
    return _fmt(med, digits), f"{_fmt(min(values), digits)}\u2013{_fmt(max(values), digits)}"


def rates_table(results: list[Row]) -> str:
    rows = [r for r in results if r.get("rate") and r["scenario"] not in ("steady", "memory")]
    groups = _by_key(rows)
    lines = [
        "| scenario | system | variant | n | median /s | min\u2013max /s | \u00d7 ref | tx/msg | WAL B/msg (min) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    order = {s: i for i, s in enumerate(SCENARIO_ORDER)}
    keys = sorted(
        groups, key=lambda k: (order.get(groups[k][0]["scenario"], 99), _first_index(rows, k))
    )
    for key in keys:
        group = groups[key]
        first = group[0]
        med, span = _summary([g["rate"] for g in group])
        ratios = [x for g in group if (x := paired_ratio(results, g)) is not None]
        ratio = (
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}\u2013{max(ratios):.2f})"
            if ratios
            else ""
        )
        if first["key"] == first.get("ref") or not first.get("ref"):
            ratio = ratio or ("ref" if _is_reference(key, results) else "")
        tx = [g["tx_per_msg"] for g in group if g.get("tx_per_msg") is not None]
        wal = [g["wal_per_msg"] for g in group if g.get("wal_per_msg") is not None]
        lines.append(
            f"| {first['scenario']} | {first['system']} | {first['variant']} | "
            f"{_fmt(statistics.median(g['n'] for g in group))} | {med} | {span} | {ratio} | "
            f"{_fmt_small(statistics.median(tx)) if tx else '—'} | "
            f"{_fmt(min(wal)) if wal else '—'} |"
        )
    return "\n".join(lines)


def paired_ratio(results: list[Row], row: Row) -> float | None:
    """Rate / reference rate: the reference measured in alternation with this case when
    there is one (``paired_ref_rate``), else the reference case of the same repetition."""
    if not row.get("rate"):
        return None
    paired = row["extra"].get("paired_ref_rate")
    if paired:
        return float(row["rate"]) / paired
    if row.get("ref"):
        ref = _rate_in_rep(results, row["ref"], row["rep"])
        if ref:
            return float(row["rate"]) / ref
    return None


def _first_index(rows: list[Row], key: str) -> int:
    for i, r in enumerate(rows):
        if r["key"] == key:
            return i
    return 0


def _is_reference(key: str, results: list[Row]) -> bool:
    return any(r.get("ref") == key for r in results)


def latency_table(results: list[Row]) -> str:
    rows = [r for r in results if r["scenario"] == "latency"]
    groups = _by_key(rows)
    if not groups:
        return ""
    lines = [
        "| system | variant | p50 ms: median (min\u2013max) | p99 ms: median (min\u2013max) | samples |",
        "|---|---|---:|---:|---:|",
    ]
    for group in groups.values():
        p50 = [g["extra"]["p50_ms"] for g in group]
        p99 = [g["extra"]["p99_ms"] for g in group]
        lines.append(
            f"| {group[0]['system']} | {group[0]['variant']} | "
            f"{statistics.median(p50):.2f} ({min(p50):.2f}\u2013{max(p50):.2f}) | "
            f"{statistics.median(p99):.2f} ({min(p99):.2f}\u2013{max(p99):.2f}) | "
            f"{sum(g['extra'].get('samples', 0) for g in group)} |"
        )
    return "\n".join(lines)


def memory_table(results: list[Row]) -> str:
    peaks = [r for r in results if r["scenario"] == "drain" and "peak_rss_mib" in r["extra"]]
    longs = [r for r in results if r["key"] == "pgq.worker.rss_long"]
    if not peaks and not longs:
        return ""
    lines = ["| worker | measure | median (min\u2013max) |", "|---|---|---:|"]
    for group in _by_key(peaks).values():
        values = [g["extra"]["peak_rss_mib"] for g in group]
        lines.append(
            f"| {group[0]['variant']} | peak RSS (VmHWM) of the worker process, MiB | "
            f"{statistics.median(values):.1f} ({min(values):.1f}\u2013{max(values):.1f}) |"
        )
    for r in longs:
        e = r["extra"]
        lines.append(
            f"| {r['variant']} | RSS after warm-up \u2192 end, MiB | "
            f"{e['rss_warm_mib']:.1f} \u2192 {e['rss_end_mib']:.1f} |"
        )
        lines.append(
            f"| {r['variant']} | RSS slope after warm-up, KiB per 100,000 messages | "
            f"{e['slope_kib_per_100k']:.1f} |"
        )
    return "\n".join(lines)


def steady_table(results: list[Row]) -> str:
    groups = _by_key(r for r in results if r["scenario"] == "steady")
    if not groups:
        return ""
    lines = [
        "| system | variant | offered /s | processed /s | lag p50 ms | lag p99 ms | lag max ms | e2e p50 ms | e2e p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def med(group: list[Row], name: str) -> str:
        values = [g["extra"][name] for g in group if name in g["extra"]]
        return f"{statistics.median(values):,.1f}" if values else "—"

    for group in groups.values():
        lines.append(
            f"| {group[0]['system']} | {group[0]['variant']} | {med(group, 'offered_rate')} | "
            f"{_fmt(statistics.median(g['rate'] for g in group))} | {med(group, 'lag_p50_ms')} | "
            f"{med(group, 'lag_p99_ms')} | {med(group, 'lag_max_ms')} | "
            f"{med(group, 'p50_ms')} | {med(group, 'p99_ms')} |"
        )
    return "\n".join(lines)


# --- targets --------------------------------------------------------------------------------

PerRep = Callable[[list[Row], int], float | None]


@dataclass(frozen=True)
class Target:
    name: str
    per_rep: PerRep
    op: str  # ">=" or "<="
    threshold: float
    unit: str = "\u00d7"
    note: str = ""  # its {placeholder} in bench/summary.md

    def values(self, results: list[Row]) -> list[float]:
        """Its figure in each repetition that has one."""
        reps = sorted({r["rep"] for r in results})
        return [v for rep in reps if (v := self.per_rep(results, rep)) is not None]


def _best(prefix: str, sync: bool = False) -> PerRep:
    """The best ratio to the reference among the drains whose key starts with ``prefix``
    (each against the reference measured alongside it), with synchronous acks or without."""

    def compute(results: list[Row], rep: int) -> float | None:
        ratios = [
            x
            for r in results
            if r["rep"] == rep
            and r["key"].startswith(prefix)
            and r["scenario"] == "drain"
            and r["key"].endswith(".sync") == sync
            and (x := paired_ratio(results, r)) is not None
        ]
        return max(ratios) if ratios else None

    return compute


def _ratio(num: PerRep, den: PerRep) -> PerRep:
    def compute(results: list[Row], rep: int) -> float | None:
        a, b = num(results, rep), den(results, rep)
        return a / b if a and b else None

    return compute


def _vs(key: str, ref: str) -> PerRep:
    """The rate of ``key`` over the rate of ``ref`` in the same repetition."""
    return _ratio(
        lambda res, rep: _rate_in_rep(res, key, rep), lambda res, rep: _rate_in_rep(res, ref, rep)
    )


def _extra(key: str, name: str) -> PerRep:
    def compute(results: list[Row], rep: int) -> float | None:
        for r in results:
            if r["key"] == key and r["rep"] == rep and name in r["extra"]:
                return float(r["extra"][name])
        return None

    return compute


SAME = "\u21b3 the same"
# enqueue_many() (1,000 per call) against the bare raw COPY (the target), and against a raw COPY
# of the same rows into a copy of its table (what the library itself costs): (key suffix, what,
# summary.md placeholder).
BULK = [
    ("", "", "enqueue_many"),
    (".dedup", ", a dedup key each", "enqueue_many_keyed"),
    (".fair", ", fair queue", "enqueue_many_fair"),
    (".fair_dedup", ", fair queue, a dedup key each", "enqueue_many_fair_keyed"),
]
LIVE_COPY = f"{SAME} / its rows COPY'd raw into a copy of its table"
BEST_WORKER = "`pgq_worker` (best setting)"
SYNC_ACKS = f"{SAME} with `SYNCHRONOUS_ACKS = True` (like for like)"
LATENCY = "idle latency enqueue \u2192 handler start"

# fmt: off
TARGETS = [
    Target("single `enqueue()` / raw INSERT+NOTIFY+commit",
           _vs("pgq.enqueue", "raw.insert1_notify"), ">=", 0.9, note="enqueue"),
    Target(f"{SAME} / `enqueue()`'s own statement sent raw into its table",
           _vs("pgq.enqueue", "raw.enqueue_statement"), ">=", 0.9, note="enqueue_own"),
    Target("`enqueue_on_commit()` / raw INSERT+NOTIFY+commit",
           _vs("pgq.enqueue_on_commit", "raw.insert1_notify"), ">=", 0.9),
    Target(f"{SAME} / `enqueue()`'s own statement sent raw from an `on_commit` hook",
           _vs("pgq.enqueue_on_commit", "raw.enqueue_statement_on_commit"), ">=", 0.9,
           note="enqueue_on_commit_own"),
    *(
        target
        for suffix, what, note in BULK
        for target in (
            Target(f"`enqueue_many()`{what} / raw COPY",
                   _vs(f"pgq.enqueue_many{suffix}", "raw.copy"), ">=", 0.7, note=note),
            Target(LIVE_COPY, _vs(f"pgq.enqueue_many{suffix}", f"raw.copy_live{suffix}"),
                   ">=", 0.7, note=f"{note}_live"),
        )
    ),
    Target("lease + complete, batch 100 / raw lease-then-archive, batch 100",
           _vs("pgq.lease_complete.b100", "raw.lease_archive.b100"), ">=", 0.7,
           note="lease_complete"),
    Target(SYNC_ACKS, _vs("pgq.lease_complete.b100.sync", "raw.lease_archive.b100"), ">=", 0.7),
    Target(f"{BEST_WORKER} / raw lease-then-archive, batch 100",
           _best("pgq.worker."), ">=", 0.5, note="worker_best"),
    Target(SYNC_ACKS, _best("pgq.worker.", sync=True), ">=", 0.5, note="worker_sync"),
    Target(f"{BEST_WORKER} / best peer (best setting)",
           _ratio(_best("pgq.worker."), _best("peer.")), ">=", 2.0, note="vs_peer"),
    Target(f"{LATENCY}, p50", _extra("pgq.latency", "p50_ms"), "<=", 2.0, "ms", "lat_p50"),
    Target(f"{LATENCY}, p99", _extra("pgq.latency", "p99_ms"), "<=", 5.0, "ms", "lat_p99"),
    Target("claim rate at big backlog / at 1,000 ready",
           _vs("pgq.claim.big", "pgq.claim.small"), ">=", 0.9, note="claim"),
    Target("8 producers: NOTIFY on / NOTIFY off",
           _vs("pgq.producers_notify", "pgq.producers_nonotify"), ">=", 0.95, note="notify"),
    Target("worker RSS growth after warm-up over the long run",
           _extra("pgq.worker.rss_long", "growth_mib"), "<=", 10.0, "MiB"),
]
# fmt: on


def _span(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}\u2013{max(values):.2f})"


def targets_table(results: list[Row]) -> tuple[str, list[tuple[str, str]]]:
    lines = ["| target | measured: median (min\u2013max) | target | met? |", "|---|---:|---:|:--:|"]
    verdicts = []
    for t in TARGETS:
        values = t.values(results)
        if not values:
            lines.append(f"| {t.name} | not measured | {t.op} {t.threshold:g} {t.unit} | \u2014 |")
            verdicts.append((t.name, "not measured"))
            continue
        med = statistics.median(values)
        met = med >= t.threshold if t.op == ">=" else med <= t.threshold
        lines.append(
            f"| {t.name} | {_span(values)} {t.unit} | {t.op} {t.threshold:g} {t.unit} "
            f"| {'yes' if met else '**NO**'} |"
        )
        verdicts.append((t.name, "met" if met else "missed"))
    return "\n".join(lines), verdicts


def summary_table(results: list[Row]) -> str:
    """The headline comparisons of a run, median (min\u2013max) over its repetitions."""
    lines = ["| comparison | median (min\u2013max) |", "|---|---:|"]
    for t in TARGETS:
        if values := t.values(results):
            lines.append(f"| {t.name} | {_span(values)} {t.unit} |")
    return "\n".join(lines)


def detail_tables(results: list[Row]) -> str:
    """Every case of a run: rates, then latency, steady state and memory when measured."""
    parts = ["### Rates\n\n" + rates_table(results)]
    for title, table in (
        ("Latency (idle worker, trickle)", latency_table(results)),
        ("Steady state", steady_table(results)),
        ("Worker memory", memory_table(results)),
    ):
        if table:
            parts.append(f"### {title}\n\n{table}")
    return "\n\n".join(parts) + "\n"


def full_report(results: list[Row]) -> str:
    reps = sorted({r["rep"] for r in results})
    targets, _ = targets_table(results)
    parts = [
        f"Repetitions: {len(reps)}. Rates are messages/s; `\u00d7 ref` is the ratio to the raw "
        "reference named in the text, computed within each repetition, median (min\u2013max).",
        "### Targets\n\n" + targets,
        detail_tables(results),
    ]
    return "\n\n".join(parts)
