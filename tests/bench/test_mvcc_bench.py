"""The MVCC-pressure scenarios (bench/mvcc*.py) in a tiny configuration on their own private
cluster, and their ratios computed from a run's series."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from bench import mvcc, mvcc_report, mvcc_scale
from bench.context import VENVS_DIR
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


def test_an_export_row_says_how_the_export_ran_and_at_what_cpu_priority() -> None:
    run = {**synthetic_run(rate_during=100.0), "system": "django-pgqueue", "load": 0.7}
    run |= {"export": True, "export_runs": 12, "export_cpu": "idle"}
    run["figures"] = mvcc.figures(run)
    following = run | {"export_every": 10.0, "export_cpu": "normal"}
    bounded = following | {"export_max_ranges": 2}

    table = mvcc_report.snapshot_table([run, following, bounded])

    assert "| django-pgqueue + pgq_pipeline export (12 passes, CPU idle) |" in table
    assert "| django-pgqueue + pgq_pipeline export (--every 10, 12 passes, CPU normal) |" in table
    assert (
        "| django-pgqueue + pgq_pipeline export (--every 10, --max-ranges 2, 12 passes,"
        " CPU normal) |" in table
    )


def backlog_case(**overrides: object) -> dict[str, object]:
    case = {
        "tenants": 0,
        "big": 3000,
        "measured": 300,
        "small_rate": 1000.0,
        "big_rate": 950.0,
        "ratio": 0.95,
        "table_mib": 1.0,
    }
    return {**case, **overrides}


def test_backlog_table_names_ours_by_its_queue_and_a_peer_by_its_worker() -> None:
    cases = [
        backlog_case(),  # a run saved before the peers ran here: no system, no timed count
        backlog_case(system="django-pgqueue", tenants=30, timed=300),
        backlog_case(system="PgQueuer", worker="QueueManager drain", timed=400, ratio=0.8),
    ]

    rows = mvcc_report.backlog_table(cases).splitlines()[2:]

    assert rows[0].startswith("| django-pgqueue, plain | 3,000 | 300 | 1,000 | 950 | 0.95 ✓ |")
    assert rows[1].startswith("| django-pgqueue, fair, 30 tenants |")
    # A peer's drain stops a batch late: the count it really ran is the one shown.
    assert rows[2].startswith("| PgQueuer (QueueManager drain) | 3,000 | 400 |")
    assert "0.80 ✗" in rows[2]


def test_backlog_table_shows_what_the_server_wrote_per_message_in_each_timing() -> None:
    wal = {
        "small": {"wal_kib_per_msg": 1.25, "fpi_per_msg": 0.01, "checkpoints": 0},
        "big": {"wal_kib_per_msg": 9.5, "fpi_per_msg": 1.02, "checkpoints": 3},
    }

    row = mvcc_report.backlog_table([backlog_case(wal=wal)]).splitlines()[2]

    assert "| 0.95 ✓ | 1.2 → 9.5 | 0.01 → 1.02 | 3 | - | 1 |" in row
    # A case saved before the server's writes were counted.
    assert "| 0.95 ✓ | - | - | - | - | 1 |" in mvcc_report.backlog_table([backlog_case()])


def test_backlog_table_shows_the_head_walks_buffers_after_each_timing() -> None:
    case = backlog_case(head_walk_buffers={"small": 412, "big": 1530})

    row = mvcc_report.backlog_table([case]).splitlines()[2]

    assert "| 412 → 1,530 | 1 |" in row


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_the_head_walk_reads_more_buffers_with_each_message_processed_before_vacuum(
    fair: bool,
) -> None:
    from django.db import connection

    from django_pgqueue.models import Message

    Message.objects.bulk_create(
        Message(queue="walked", task="tests.noop", payload={}, fair_order=i if fair else None)
        for i in range(3000)
    )
    connection.ensure_connection()
    conn = connection.connection
    conn.execute("VACUUM ANALYZE pgqueue_message")
    clean = mvcc_scale.head_walk_buffers(conn, "walked", fair)

    # Processed: gone from the table, their index entries at the head dead until vacuum.
    first = (
        Message.objects.filter(queue="walked").order_by("id").values_list("id", flat=True)[:2500]
    )
    Message.objects.filter(id__in=list(first)).delete()
    after = mvcc_scale.head_walk_buffers(conn, "walked", fair)

    assert after > clean + 5
    conn.execute("VACUUM pgqueue_message")
    assert mvcc_scale.head_walk_buffers(conn, "walked", fair) < after


def test_workers_table_shows_each_systems_worker_and_notes_procrastinates_fewer_messages() -> None:
    figures = {
        "rate": 500.0,
        "worker_cpu_ms_per_msg": 1.5,
        "server_cpu_ms_per_msg": 1.0,
        "connections_peak": 7,
    }
    rows = [
        {"workers": 1, "n": 1000, **figures},  # saved before the peers ran here
        {"system": "Procrastinate", "worker": "worker concurrency 4", "workers": 2, "n": 1000}
        | figures,
    ]

    text = mvcc_report.markdown({"args": {}, "loadavg_start": [0, 0, 0], "workers": rows})

    assert "| django-pgqueue (pgq_worker --concurrency 4) | 1 | 1,000 | 500 |" in text
    assert "| Procrastinate (worker concurrency 4) | 2 | 1,000 | 500 | 1.500 | 1.000 | 7 |" in text
    assert "drains a twentieth" in text


# The backlog and workers scenarios at their smallest: 3,000 ready, 1 and 2 workers.
TINY_SCALE = ("--backlog", "3000", "--claimed", "300", "--workers", "1,2", "--workers-n", "1000")


def clusters() -> set[tuple[str, str]]:
    """This machine's clusters (pg_lsclusters): (version, name) pairs."""
    listed = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout
    return {(line.split()[0], line.split()[1]) for line in listed.splitlines() if line.strip()}


def process_runs(pid: str) -> bool:
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


@pytest.mark.slow
@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_every_scenario_runs_on_a_private_cluster_and_removes_it(tmp_path: Path) -> None:
    before = clusters()
    run_bench(
        "bench",
        "mvcc",
        "--minutes",
        "0.15",
        "--sample",
        "1.5",
        "--capacity-n",
        "200",
        *TINY_SCALE,
        "--tenants",
        "30",
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
    # Each sample reads what the cluster's backends were doing, the disks and iowait.
    first, last = results["sustained"][0]["samples"][0], results["sustained"][0]["samples"][-1]
    assert last["wait_looks"] > first["wait_looks"]
    assert sum(n for key, n in last["waits"].items() if key.startswith("queue ")) > 0
    assert last["disk_written"] >= first["disk_written"] > 0
    assert last["machine_iowait"] >= first["machine_iowait"]
    assert results["snapshot"][0]["commit_at"] > results["snapshot"][0]["snapshot_at"]
    assert len(results["snapshot"][0]["processed"]) > 0
    assert [c["tenants"] for c in results["backlog"]] == [0, 30]
    # Both timings processed as many messages: their head walks pass as many dead entries.
    for case in results["backlog"]:
        assert case["head_walk_buffers"]["small"] > 0 and case["head_walk_buffers"]["big"] > 0
    assert [r["workers"] for r in results["workers"]] == [1, 2]
    assert "Backlog scale" in (tmp_path / "report.md").read_text()
    # The cluster's log is kept: checkpoints and autovacuum runs to set stalls against.
    assert "database system is ready" in (tmp_path / "postgresql.log").read_text()
    # Another bench on this machine may have a cluster of its own (named after its live pid).
    left = [c for c in clusters() - before if not process_runs(c[1].rsplit("_", 1)[-1])]
    assert left == []


PEERS = ["pgqueuer", "procrastinate"]


@pytest.mark.slow
@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
@pytest.mark.skipif(
    not all((VENVS_DIR / p / "bin" / "python").exists() for p in PEERS),
    reason="no peer virtualenvs (bash bench/run.sh --setup-only)",
)
def test_the_peers_run_in_the_backlog_and_workers_scenarios(tmp_path: Path) -> None:
    run_bench(
        "bench",
        "mvcc",
        "--only",
        "backlog,workers",
        *TINY_SCALE,
        "--tenants",
        "0",
        "--peers",
        ",".join(PEERS),
        "--no-plots",
        "--out",
        str(tmp_path),
    )

    results = json.loads((tmp_path / "mvcc.json").read_text())
    backlog = {c["system"]: c for c in results["backlog"]}
    assert list(backlog) == ["django-pgqueue", "PgQueuer", "Procrastinate"]
    for case in backlog.values():
        assert case["small_rate"] > 0 and case["big_rate"] > 0
        # A peer's count-and-stop may run a batch or two more than asked, never fewer.
        assert case["measured"] <= case["timed"] <= case["measured"] + 200
    # Procrastinate is timed on at least 1,000 jobs, however few the others are.
    assert backlog["Procrastinate"]["measured"] == 1000
    workers = [(r["system"], r["workers"]) for r in results["workers"]]
    assert workers == [(s, n) for s in backlog for n in (1, 2)]
    for row in results["workers"]:
        assert row["rate"] > 0 and row["connections_peak"] > 0
        assert row["n"] == row.get("loaded", 1000) == 1000
    report = (tmp_path / "report.md").read_text()
    assert "| Procrastinate (worker concurrency 4, wait=False) | 3,000 | 1,000 |" in report


@pytest.mark.parametrize("cpu", sorted(mvcc.EXPORT_CPU))
def test_each_export_cpu_priority_starts_a_process_at_that_priority(cpu: str) -> None:
    policy = subprocess.run(
        [
            *mvcc.EXPORT_CPU[cpu],
            "sh",
            "-c",
            "chrt -p $$; cat /proc/$$/autogroup 2>/dev/null; ps -o sid= -p $$; echo $$; "
            "cut -d' ' -f19 /proc/$$/stat",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    *_, session, pid, nice = policy.split()
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")

    assert ("SCHED_IDLE" in policy) == (cpu == "idle")
    assert nice == ("19" if cpu in ("low", "background") else "0")
    assert (session == pid) == (cpu == "background")
    if cpu == "background" and autogroup.exists() and autogroup.read_text().strip() == "1":
        assert "nice 19" in policy


def test_a_process_tree_holds_the_root_and_its_descendants() -> None:
    parent = subprocess.Popen(["sh", "-c", "sh -c 'sleep 30 & wait' & wait"])
    try:
        mvcc.wait_until(lambda: len(mvcc.process_tree(parent.pid)) == 3, 10, 0.05)
        tree = mvcc.process_tree(parent.pid)
        names = [Path(f"/proc/{pid}/comm").read_text().strip() for pid in tree]
    finally:
        for pid in reversed(mvcc.process_tree(parent.pid)):
            os.kill(pid, signal.SIGKILL)
        parent.wait()

    assert tree[0] == parent.pid
    assert sorted(names) == ["sh", "sh", "sleep"]
