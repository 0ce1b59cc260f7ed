"""bench/head_walk.py in a tiny configuration, so that it cannot rot: a real PostgreSQL, the
benchmark in a process of its own."""

from __future__ import annotations

import os

import pytest

from .bench_process import run_bench, table_rows
from .test_bench_smoke import server_dsn

pytestmark = pytest.mark.slow


def _run(tenants: int) -> list[list[str]]:
    env = {
        **os.environ,
        "BENCH_SERVER_DSN": server_dsn(),
        "BENCH_HEAD_WALK_DB": os.environ.get("PGQUEUE_TEST_DB", "test_pgqueue") + "_walk",
    }
    args = ("--ready", "3000", "--tenants", str(tenants), "--spells", "3", "--spell", "600")
    return table_rows(run_bench("bench.head_walk", *args, env=env))[1:]


def number(cell: str) -> int:
    return int(cell.strip().replace(",", ""))


@pytest.mark.parametrize("tenants", [0, 30], ids=["plain", "fair"])
def test_the_head_walk_grows_with_the_messages_processed_since_vacuum(tenants: int) -> None:
    rows = _run(tenants)

    assert [number(r[0]) for r in rows] == [0, 600, 1200, 1800]
    assert rows[0][1].strip() == "-" and all(number(r[1]) > 0 for r in rows[1:])
    walks = [number(r[2]) for r in rows]
    assert walks[-1] > walks[0] + 3  # 1,800 dead entries at the head
    if tenants:
        # The claims' own walks, from their bounds, and a fair enqueue's place stay flat.
        assert rows[0][3].strip() == "-"
        bounded = [number(r[3]) for r in rows[1:]]
        assert max(bounded) <= min(bounded) + 25 and bounded[-1] < walks[-1], rows
        places = [number(r[4]) for r in rows]
        assert places[-1] <= places[0] + 3, rows
    else:
        assert {r[3].strip() for r in rows} == {r[4].strip() for r in rows} == {"-"}
