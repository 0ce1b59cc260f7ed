"""``python -m bench flow`` in a tiny configuration: its drains run and its tables
print, so that the flow-control benchmark cannot rot. Real PostgreSQL, real claimer and
worker processes."""

from __future__ import annotations

import os

import pytest

from .bench_process import run_bench, table_rows
from .test_bench_smoke import server_dsn

pytestmark = pytest.mark.slow


def bench_env() -> dict[str, str]:
    name = os.environ.get("PGQUEUE_TEST_DB", "test_pgqueue") + "_flow_bench"
    return {**os.environ, "BENCH_SERVER_DSN": server_dsn(), "BENCH_FLOW_DB": name}


def test_the_claimers_drain_every_queue_and_the_ratios_print() -> None:
    printed = run_bench(
        "bench",
        "flow",
        *("--only", "throughput", "--quick", "--batches", "10", "--scale", "0.25"),
        "--claims-only",
        env=bench_env(),
    )

    header, row = table_rows(printed)
    assert header[1].strip() == "raw SQL claim+delete"
    cells = [cell.strip() for cell in row]
    assert cells[0] == "10"
    # Left out by --claims-only: the raw reference and the drains with work.
    assert cells[1] == cells[7] == cells[8] == cells[9] == "-"
    plain, fair, flow = (float(cells[i].replace(",", "")) for i in (2, 3, 5))
    assert plain > 0 and fair > 0 and flow > 0
    assert float(cells[6]) == pytest.approx(flow / plain, abs=0.01)


def test_the_workers_archive_the_whole_backlog_of_each_queue() -> None:
    # The bench asserts that every message of the backlog reached the archive.
    printed = run_bench(
        "bench",
        "flow",
        *("--only", "workers", "--quick", "--batches", "1,100", "--scale", "0.5"),
        env=bench_env(),
    )

    header, *rows = table_rows(printed)
    assert [cell.strip() for cell in header][:2] == ["batch", "plain"]
    assert [row[0].strip() for row in rows] == ["1", "100"]
