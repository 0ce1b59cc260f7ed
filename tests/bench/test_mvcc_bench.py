"""The MVCC-pressure scenarios (bench/mvcc*.py) in a tiny configuration on their own private
cluster, and their ratios computed from a run's series."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import mvcc, mvcc_report
from bench.private_server import unavailable_reason

from .bench_process import run_bench


def synthetic_run(rate_during: float) -> dict[str, object]:
    """100 s at 100 msgs/s, ``rate_during`` over [25, 75), backlog 5 calm and 400 during."""

    def rate(second: int) -> float:
        return rate_during if 25 <= second < 75 else 100.0

    def buffers_per_message(second: int) -> int:
        return 10 if second < 25 else 30

    processed: list[float] = []
    for second in range(100):
        processed += [second + k / rate(second) for k in range(int(rate(second)))]
    backlog = [(float(t), 400 if 25 <= t < 80 else 5) for t in range(100)]
    samples = [
        {
            "t": float(t),
            "tables": {"pgqueue_message": {"dead": 10, "index_bytes": 2**20, "live": 1}},
            "claim_buffers": sum(rate(s) * buffers_per_message(s) for s in range(t)),
            "system_buffers": sum(2 * rate(s) * buffers_per_message(s) for s in range(t)),
        }
        for t in range(0, 100, 10)
    ]
    return {
        "key": "pgq",
        "seconds": 100.0,
        "capacity": 150.0,
        "offered": 100.0,
        "processed": processed,
        "latency": [[t, 5.0 if t < 25 else 12.0] for t in processed],
        "backlog": backlog,
        "samples": samples,
        "snapshot_at": 25.0,
        "commit_at": 75.0,
    }


def test_figures_read_the_issue_ratios_from_a_run() -> None:
    figures = mvcc.figures(synthetic_run(rate_during=90.0))

    assert figures["during_over_before"] == pytest.approx(0.9, abs=0.01)
    assert figures["backlog_max_over_10s_load"] == pytest.approx(0.4)
    assert figures["buffers_ratio"] == pytest.approx(3.0, rel=0.05)
    assert figures["all_buffers_per_msg_during"] == pytest.approx(60.0, rel=0.05)
    assert figures["p99_ratio"] == pytest.approx(12.0 / 5.0)
    # The backlog is back under one second of offered load 5 s after COMMIT.
    assert figures["recovery_s"] == pytest.approx(5.0)


def test_a_sustained_run_reports_its_index_size_at_the_end_of_each_quarter() -> None:
    run = {**synthetic_run(rate_during=100.0), "snapshot_at": None, "commit_at": None}
    for sample in run["samples"]:  # type: ignore[attr-defined]
        sample["tables"]["pgqueue_message"]["index_bytes"] = int(sample["t"]) * 2**20

    figures = mvcc.figures(run)

    # Samples every 10 s; the quarters end at 25, 50, 75 and 100 s.
    assert [figures[f"index_mib_q{q}"] for q in (1, 2, 3, 4)] == [20.0, 50.0, 70.0, 90.0]
    table = mvcc_report.sustained_table([{**run, "system": "x", "worker": "w", "figures": figures}])
    assert "20.0 · 50.0 · 70.0 · 90.0" in table
    # 100 processed a second of 100 offered in the last quarter.
    assert "| 1.00 ✓ | 1.00 |" in table


def test_report_marks_a_missed_target() -> None:
    run = {**synthetic_run(rate_during=90.0), "system": "x", "load": 0.7}
    run["figures"] = mvcc.figures(run)

    table = mvcc_report.snapshot_table([run])

    assert "0.90 ✗" in table
    assert "0.40 ✓" in table


@pytest.mark.slow
@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_every_scenario_runs_on_a_private_cluster_and_removes_it(tmp_path: Path) -> None:
    before = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout
    run_bench(
        "bench.mvcc_cli",
        "--minutes",
        "0.25",
        "--sample",
        "2",
        "--capacity-n",
        "200",
        "--backlog",
        "3000",
        "--tenants",
        "30",
        "--claimed",
        "300",
        "--workers",
        "1,2",
        "--workers-n",
        "1000",
        "--no-peers",
        "--server-setting",
        "work_mem=8MB",
        "--no-plots",
        "--out",
        str(tmp_path),
    )

    results = json.loads((tmp_path / "mvcc.json").read_text())
    assert results["postgres"]["work_mem"] == "8192kB"
    assert [r["key"] for r in results["sustained"]] == ["pgq"]
    assert results["snapshot"][0]["commit_at"] > results["snapshot"][0]["snapshot_at"]
    assert len(results["snapshot"][0]["processed"]) > 0
    assert [c["tenants"] for c in results["backlog"]] == [0, 30]
    assert [r["workers"] for r in results["workers"]] == [1, 2]
    assert "Backlog scale" in (tmp_path / "report.md").read_text()
    # The cluster's log is kept: checkpoints and autovacuum runs to set stalls against.
    assert "database system is ready" in (tmp_path / "postgresql.log").read_text()
    after = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout
    assert after == before
