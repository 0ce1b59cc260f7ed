"""bench/ack_shapes.py in a tiny configuration, so that it cannot rot: a real PostgreSQL,
the benchmark in a process of its own."""

from __future__ import annotations

import os

import pytest

from .bench_process import run_bench, table_rows
from .test_bench_smoke import server_dsn

pytestmark = pytest.mark.slow


def test_the_benchmark_completes_every_message_with_both_statements_in_both_cases() -> None:
    env = {
        **os.environ,
        "BENCH_SERVER_DSN": server_dsn(),
        "BENCH_FLOW_DB": os.environ.get("PGQUEUE_TEST_DB", "test_pgqueue") + "_acks",
    }
    rows = table_rows(
        run_bench("bench.ack_shapes", "--messages", "40", "--batch", "7", "--rounds", "2", env=env)
    )
    header, body = rows[0], rows[1:]
    assert header[-1].strip() == "shipped ÷ reference"
    cases = {(case.strip(), name.strip()) for case, name, *_ in body}
    assert cases == {
        (case, name)
        for case in ("planned on the backlog", "planned on a few rows")
        for name in ("shipped", "joined_with_unnest")
    }
    for _case, name, rate, _cpu, ratio in body:
        assert float(rate.split("(")[0].replace(",", "")) > 0
        if name.strip() == "joined_with_unnest":
            assert ratio.strip() == "1.00"
