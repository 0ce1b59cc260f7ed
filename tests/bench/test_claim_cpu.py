"""bench/claim_cpu.py in a tiny configuration, so that it cannot rot: a real PostgreSQL,
the benchmark in a process of its own."""

from __future__ import annotations

import os

import pytest

from bench.claim_cpu import QUEUES, backend_cpu

from .bench_process import run_bench, table_rows
from .test_bench_smoke import server_dsn

pytestmark = pytest.mark.slow


def test_a_process_cpu_is_read_from_proc_and_a_missing_one_is_none() -> None:
    assert (backend_cpu(os.getpid()) or 0.0) > 0.0
    assert backend_cpu(2**22 + 1) is None  # above Linux's largest pid


def test_the_benchmark_prints_a_row_per_queue_against_the_plain_one() -> None:
    env = {
        **os.environ,
        "BENCH_SERVER_DSN": server_dsn(),
        "BENCH_FLOW_DB": os.environ.get("PGQUEUE_TEST_DB", "test_pgqueue") + "_cpu",
    }
    rows = table_rows(run_bench("bench.claim_cpu", "--claims", "20", "--chunks", "2", env=env))
    header, body = rows[0], rows[1:]
    assert header[-1].strip() == "total / plain"
    assert [label.strip() for label, *_ in body] == [label for _, label in QUEUES]
    assert len(body) == len(QUEUES)
    assert body[0][-1].strip() == "1.00"
    for cells in body:
        client, server, total = (float(c.strip().replace(",", "")) for c in cells[1:4])
        assert client > 0 and server > 0 and total > 0
