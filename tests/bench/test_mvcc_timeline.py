"""bench/mvcc_timeline.py: a run's figures spell by spell, from its samples and series."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import mvcc, mvcc_cli, mvcc_timeline


def run_with_a_slow_minute() -> dict[str, object]:
    """Two minutes at 100 msgs/s; in the second the machine is busier, the export runs and
    the queue's backends wait on the WAL."""
    cores = os.cpu_count() or 1
    processed = [t / 100 for t in range(12_000)]
    samples = []
    for t in range(0, 121, 10):
        slow = max(0, t - 60)
        samples.append(
            {
                "t": float(t),
                "tables": {},
                "machine_busy": cores * (0.5 * t + 0.4 * slow),
                "machine_iowait": cores * 0.1 * slow,
                "server_cpu": 0.3 * t,
                "worker_cpu": 0.2 * t,
                "export_cpu": 0.5 * slow,
                "disk_written": 1e6 * t + 9e6 * slow,
                "disk_busy": 0.05 * t,
                "waits": {"queue running": t, "queue LWLock:WALWrite": 2 * slow},
                "wait_looks": t,
            }
        )
    return {
        "system": "django-pgqueue",
        "seconds": 120.0,
        "processed": processed,
        "latency": [[t, 5.0 if t < 60 else 50.0] for t in processed],
        "backlog": [(float(t), 10 if t < 60 else 300) for t in range(120)],
        "samples": samples,
        "snapshot_at": 60.0,
        "commit_at": 120.0,
    }


def test_each_spell_shows_the_queue_the_machine_and_what_the_backends_waited_on() -> None:
    calm, slow = mvcc_timeline.spell_rows(run_with_a_slow_minute(), 60.0)

    assert calm.split(" | ") == [
        "| 0-1", "", "100", "5.0", "5", "10", "0.50", "0.00", "0.30", "0.20", "0.00",
        "1.0", "0.05", "queue running 1.00 |",
    ]  # fmt: skip
    assert slow.split(" | ") == [
        "| 1-2", "yes", "100", "50.0", "50", "300", "0.90", "0.10", "0.30", "0.20", "0.50",
        "10.0", "0.05", "queue LWLock:WALWrite 2.00 · queue running 1.00 |",
    ]  # fmt: skip


def test_a_run_sampled_before_a_figure_was_read_shows_a_dash_for_it() -> None:
    run = run_with_a_slow_minute()
    for sample in run["samples"]:  # type: ignore[attr-defined]
        del sample["disk_written"], sample["waits"]

    row = mvcc_timeline.spell_rows(run, 60.0)[0].split(" | ")

    assert row[11] == "-"
    assert row[-1] == "- |"


@pytest.mark.parametrize("spell", [30.0, 45.0])
def test_spells_cover_the_run(spell: float) -> None:
    rows = mvcc_timeline.spell_rows(run_with_a_slow_minute(), spell)

    assert rows[0].startswith("| 0-")
    assert len(rows) == -(-120 // int(spell))


def test_the_report_of_an_export_run_goes_on_minute_by_minute(tmp_path: Path) -> None:
    run = run_with_a_slow_minute() | {"key": "pgq", "capacity": 150.0, "offered": 100.0}
    run |= {"load": 0.7, "export": True, "export_runs": 4, "export_every": 10.0}
    run["figures"] = mvcc.figures(run)
    results = {"args": {"minutes": 2.0}, "loadavg_start": [0, 0, 0], "export": [run]}

    mvcc_cli.write_report(results, tmp_path)

    report = (tmp_path / "report.md").read_text()
    assert "## pgq_pipeline export over the middle half" in report
    assert "### django-pgqueue: by 60-second spell" in report
    assert "| 1-2 | yes | 100 | 50.0 |" in report
