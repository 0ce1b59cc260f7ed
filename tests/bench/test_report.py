"""The benchmark's report: ratios within a repetition, and a plain verdict on each target."""

from __future__ import annotations

from bench.report import paired_ratio, rates_table, targets_table


def row(key: str, rep: int, rate: float, ref: str | None = None, **extra: object) -> dict:
    return {
        "key": key,
        "scenario": "enqueue",
        "system": "s",
        "variant": key,
        "rep": rep,
        "ref": ref,
        "n": 100,
        "seconds": 1.0,
        "rate": rate,
        "tx_per_msg": 1.0,
        "wal_per_msg": 300.0,
        "extra": dict(extra),
    }


def test_ratios_are_taken_within_each_repetition() -> None:
    results = [
        row("raw.insert1", 0, 1000.0),
        row("pgq.enqueue", 0, 900.0, "raw.insert1"),
        # Repetition 1 ran on a machine three times slower: the ratio is the same.
        row("raw.insert1", 1, 300.0),
        row("pgq.enqueue", 1, 270.0, "raw.insert1"),
    ]
    assert [paired_ratio(results, r) for r in results[1::2]] == [0.9, 0.9]
    assert "| 0.90 (0.90\u20130.90) |" in rates_table(results)


def test_a_paired_reference_wins_over_the_repetition_reference() -> None:
    results = [
        row("raw.insert1", 0, 1000.0),
        row("peer.x.enqueue", 0, 100.0, "raw.insert1", paired_ref_rate=400.0),
    ]
    assert paired_ratio(results, results[1]) == 0.25


def test_missed_and_unmeasured_targets_are_said_plainly() -> None:
    results = [
        row("raw.insert1_notify", 0, 1000.0),
        row("pgq.enqueue", 0, 500.0, "raw.insert1_notify"),
        row("raw.copy", 0, 100_000.0),
        row("pgq.enqueue_many", 0, 90_000.0, "raw.copy"),
    ]
    table, verdicts = targets_table(results)
    verdict = dict(verdicts)
    assert verdict["single `enqueue()` / raw INSERT+NOTIFY+commit"] == "missed"
    assert verdict["`enqueue_many()` / raw COPY"] == "met"
    assert verdict["idle latency enqueue \u2192 handler start, p50"] == "not measured"
    assert "**NO**" in table


def test_single_enqueue_is_held_to_a_reference_doing_the_same_work() -> None:
    # enqueue() sends its NOTIFY: the target compares it with INSERT + NOTIFY + commit,
    # not with a plain INSERT that skips the wake-up.
    results = [
        row("raw.insert1", 0, 1000.0),
        row("raw.insert1_notify", 0, 800.0),
        row("pgq.enqueue", 0, 760.0, "raw.insert1_notify"),
        row("raw.copy", 0, 100_000.0),
        row("pgq.enqueue_many", 0, 65_000.0, "raw.copy"),
    ]
    verdict = dict(targets_table(results)[1])
    assert verdict["single `enqueue()` / raw INSERT+NOTIFY+commit"] == "met"  # 0.95 >= 0.9
    assert verdict["`enqueue_many()` / raw COPY"] == "missed"  # 0.65 < 0.7


def test_each_bulk_case_has_both_references() -> None:
    # Against the bare COPY (the target) and against the same rows COPY'd into a copy of the
    # live table (what the library itself costs), each within its repetition.
    results = [
        row("raw.copy", 0, 100_000.0),
        row("raw.copy_live.fair_dedup", 0, 60_000.0, "raw.copy"),
        row("pgq.enqueue_many.fair_dedup", 0, 48_000.0, "raw.copy"),
    ]
    table, verdicts = targets_table(results)
    assert (
        "| `enqueue_many()`, fair queue, a dedup key each / raw COPY | 0.48 (0.48\u20130.48)"
        in table
    )
    assert (
        "| \u21b3 the same / its rows COPY'd raw into a copy of its table | 0.80 (0.80\u20130.80)"
        in table
    )
    assert ("`enqueue_many()`, a dedup key each / raw COPY", "not measured") in verdicts
