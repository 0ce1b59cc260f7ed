"""``python -m bench compose`` in a tiny configuration: its drains, batch and chain run and
its tables print, so that the composition benchmark cannot rot. Real PostgreSQL, real
claimer and worker processes."""

from __future__ import annotations

import os

import pytest

from .bench_process import run_bench, table_rows
from .test_bench_smoke import server_dsn

pytestmark = pytest.mark.slow


def test_every_part_runs_and_the_callback_ran_once() -> None:
    name = os.environ.get("PGQUEUE_TEST_DB", "test_pgqueue") + "_compose_bench"
    env = {**os.environ, "BENCH_SERVER_DSN": server_dsn(), "BENCH_COMPOSE_DB": name}
    # The bench itself asserts every message archived and the batch's callback archived once.
    printed = run_bench(
        "bench",
        "compose",
        *("--reps", "1", "--plain", "500", "--members", "200", "--steps", "20"),
        env=env,
    )
    rows = {row[0].strip(): [cell.strip() for cell in row[1:]] for row in table_rows(printed)}
    assert rows["raw SQL (DELETE ... SKIP LOCKED)"][1] == "1.00"
    assert float(rows["django-pgqueue, with composition"][0].replace(",", "")) > 0
    assert float(rows["one batch + completion callback (ran once)"][0]) > 0
    p50, _, p99, worst = (float(v) for v in rows["handler end -> next handler start (host)"])
    assert 0 < p50 <= p99 <= worst
