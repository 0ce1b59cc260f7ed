"""The benchmark harness in a tiny configuration, so that it cannot rot (bench/ is not run
by the suite otherwise). Real PostgreSQL, real worker and producer processes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from psycopg.conninfo import make_conninfo

from .bench_process import run_bench

REPO_DIR = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def server_dsn() -> str:
    db = settings.DATABASES["default"]
    params = {
        "host": db.get("HOST") or None,
        "port": str(db["PORT"]) if db.get("PORT") else None,
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
    }
    return make_conninfo("", dbname="postgres", **{k: v for k, v in params.items() if v})


def test_harness_runs_every_scenario_and_reports(tmp_path: Path) -> None:
    name = os.environ.get("PGQUEUE_TEST_DB", "test_pgqueue") + "_smoke"
    run_bench(
        "bench",
        "--mode",
        "smoke",
        "--reps",
        "1",
        "--no-peers",
        "--no-plots",
        "--quiet",
        "--dsn",
        server_dsn(),
        "--db",
        name,
        "--out",
        str(tmp_path),
    )

    results = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    by_key = {r["key"]: r for r in results}
    expected = {
        "raw.insert1",
        "raw.insert1_notify",
        "raw.copy",
        "pgq.enqueue",
        "pgq.enqueue_on_commit",
        "pgq.enqueue_many",
        "pgq.enqueue_many.dedup",
        "pgq.enqueue_many.fair",
        "pgq.enqueue_many.fair_dedup",
        "raw.copy_live",
        "raw.copy_live.dedup",
        "raw.copy_live.fair",
        "raw.copy_live.fair_dedup",
        "raw.enqueue_statement",
        "raw.delete.b1",
        "raw.delete.b100",
        "raw.lease_archive.b100",
        "pgq.lease_complete.b100",
        "pgq.claim.small",
        "pgq.claim.big",
        "raw.producers",
        "pgq.producers_notify",
        "pgq.producers_nonotify",
        "raw.latency",
        "pgq.latency",
        "pgq.steady",
        "pgq.worker.rss_long",
    }
    if importlib.util.find_spec("orjson") is not None:  # the decode drains, one with each
        expected |= {"pgq.lease_complete.b100.orjson", "pgq.lease_complete.b100.json"}
    assert expected <= set(by_key), expected - set(by_key)
    assert any(k.startswith("pgq.worker.c") for k in by_key)

    for r in results:
        if r["rate"] is not None:
            assert r["rate"] > 0, r
        assert r["extra"].get("ok", True) is True, r  # every message was processed
    # One message per transaction is what a single-row INSERT + commit costs.
    assert 0.9 <= by_key["raw.insert1"]["tx_per_msg"] <= 1.5
    # enqueue() sends its NOTIFY: its reference does the same work.
    assert by_key["pgq.enqueue"]["ref"] == "raw.insert1_notify"
    assert by_key["pgq.enqueue_many.fair_dedup"]["ref"] == "raw.copy"
    # The enqueue_many() cases and their COPY reference write the same rows per transaction.
    bulk = [k for k in by_key if k.startswith(("pgq.enqueue_many", "raw.copy"))]
    assert len({by_key[k]["n"] for k in bulk}) == 1
    assert 0.9 <= by_key["raw.insert1_notify"]["tx_per_msg"] <= 1.5
    assert by_key["pgq.latency"]["extra"]["samples"] == by_key["pgq.latency"]["n"]

    report = (tmp_path / "report.md").read_text()
    assert "| target |" in report and "met?" in report
    assert "not measured" in report  # no peers in this run: that target says so plainly
    facts = json.loads((tmp_path / "facts.json").read_text())
    assert facts["postgres"]["synchronous_commit"] in {
        "on",
        "off",
        "local",
        "remote_write",
        "remote_apply",
    }
    assert not facts["failures"]

    # The docs page is that run: its summary, the command that repeats it, its machine.
    page = publish(tmp_path, tmp_path / "docs")
    assert "bash bench/run.sh --mode smoke --reps 1 --no-peers" in page
    assert "| `enqueue_many()` / raw COPY |" in page
    assert "| `enqueue_many()`, fair queue, a dedup key each / raw COPY |" in page
    assert "| \u21b3 the same / its rows COPY'd raw into a copy of its table |" in page
    assert f"commit `{facts['commit']}`" in page
    # Every figure of the summary was filled in, the bulk ones beside their twins too.
    assert not re.search(r"\{[a-z_]+\}", page), re.findall(r"\{[a-z_]+\}", page)
    assert "a copy of its table (the same columns," in page
    assert facts["commit"]  # the checkout measured, for the published page


def publish(folder: Path, docs: Path) -> str:
    command = [sys.executable, "-m", "bench", "publish", str(folder)]
    proc = subprocess.run(
        [*command, "--summary", "bench/summary.md", "--docs-dir", str(docs)],
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return (docs / "benchmarks.md").read_text()
