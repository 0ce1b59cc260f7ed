"""bench/mvcc_stalls.py: stalls of a run set against a PostgreSQL 15 log."""

from __future__ import annotations

import pytest

from bench import mvcc_stalls

LOG = """\
2026-11-27 06:26:17.755 UTC [5893] LOG:  checkpoint starting: wal
2026-11-27 06:26:52.185 UTC [5893] LOG:  checkpoint complete: wrote 2933 buffers (17.9%); \
0 WAL file(s) added, 0 removed, 33 recycled; write=34.028 s, sync=0.315 s, total=34.430 s; \
sync files=556, longest=0.028 s, average=0.001 s; distance=535488 kB, estimate=535488 kB
2026-11-27 06:26:56.937 UTC [6678] LOG:  automatic vacuum of table \
"pgq_mvcc.public.pgqueue_message": index scans: 1
\tpages: 0 removed, 23277 remain, 23277 scanned (100.00% of total)
\tsystem usage: CPU: user: 0.12 s, system: 0.14 s, elapsed: 6.48 s
2026-11-27 06:26:58.303 UTC [6678] LOG:  automatic analyze of table \
"pgq_mvcc.public.pgqueue_archive"
\tsystem usage: CPU: user: 0.10 s, system: 0.01 s, elapsed: 1.25 s
2026-11-27 06:26:58.500 UTC [6678] LOG:  automatic analyze of table \
"pgq_mvcc.pg_catalog.pg_class"
\tsystem usage: CPU: user: 0.00 s, system: 0.00 s, elapsed: 0.01 s
2026-11-27 06:27:30.000 UTC [6678] LOG:  automatic vacuum of table \
"pgq_mvcc.public.pgqueue_message": index scans: 1
\tsystem usage: CPU: user: 0.12 s, system: 0.14 s, elapsed: 2.00 s
"""

EPOCH_061700 = 1795760220.0  # 2026-11-27 06:17:00 UTC


def test_the_log_gives_sync_phases_and_autovacuum_runs_with_their_spans() -> None:
    events = mvcc_stalls.server_events(LOG)

    assert [(e.kind, e.detail) for e in events] == [
        ("checkpoint start", "wal"),
        ("checkpoint sync", "total 34.4 s"),
        ("vacuum", "pgqueue_message"),
        ("analyze", "pgqueue_archive"),
        ("analyze", "pg_class"),
        ("vacuum", "pgqueue_message"),
    ]
    sync, vacuum = events[1], events[2]
    assert sync.end - sync.start == pytest.approx(0.315)
    assert vacuum.end - vacuum.start == pytest.approx(6.48)
    assert vacuum.end == pytest.approx(EPOCH_061700 + 9 * 60 + 56.937)


def test_late_messages_less_than_a_second_apart_are_one_stall_from_the_first_enqueued() -> None:
    latency = [[10.0, 20.0], [30.0, 800.0], [30.5, 900.0], [31.2, 600.0], [40.0, 700.0]]

    found = mvcc_stalls.stalls(latency, over_ms=500)

    assert [(s.start, s.end, s.peak_ms, s.messages) for s in found] == [
        (pytest.approx(29.2), 31.2, 900.0, 3),
        (pytest.approx(39.3), 40.0, 700.0, 1),
    ]


def run(t0: float | None, counts: list[tuple[float, int]]) -> dict[str, object]:
    return {
        "system": "django-pgqueue",
        "live_table": "pgqueue_message",
        "seconds": 60.0,
        "t0": t0,
        # A stall across the first vacuum (t0 + 35..38 s when t0 is 06:26:20).
        "latency": [[38.0, 3000.0]],
        # The system's tables; the log's others (catalogs, another system's) are left out.
        "samples": [
            {"t": t, "tables": {"pgqueue_message": {"autovacuums": n}, "pgqueue_archive": {}}}
            for t, n in counts
        ],
    }


def test_without_a_recorded_start_the_run_is_aligned_by_its_autovacuum_counts() -> None:
    events = mvcc_stalls.server_events(LOG)
    t0 = EPOCH_061700 + 9 * 60 + 20  # 06:26:20
    # One vacuum ended at 06:26:56.9 (run time 36.9), the next at 06:27:30 (70).
    aligned = mvcc_stalls.aligned_t0(run(None, [(30.0, 0), (40.0, 1), (60.0, 1)]), events)

    assert aligned is not None
    assert t0 - 4 < aligned < t0 + 7  # what fits: t0 in (06:26:16.9, 06:26:26.9]


def test_the_report_names_what_a_stall_overlaps_and_what_chance_would_give() -> None:
    t0 = EPOCH_061700 + 9 * 60 + 20

    # The stall: enqueued at 06:26:55, started at 06:26:58; the sync phase ended at 06:26:52.2.
    close = mvcc_stalls.report(run(t0, [(0.0, 0)]), LOG, over_ms=500, near=1)
    slack = mvcc_stalls.report(run(t0, [(0.0, 0)]), LOG, over_ms=500, near=3)

    assert "| vacuum pgqueue_message (6.5 s), analyze pgqueue_archive (1.2 s) |" in close
    assert "- vacuum: 1 of 1 stalls overlap one" in close
    assert "pg_class" not in close
    assert "- checkpoint sync: 0 of 1 stalls overlap one" in close
    assert "checkpoint sync total 34.4 s (0.3 s)" in slack
    assert "- checkpoint sync: 1 of 1 stalls overlap one" in slack
