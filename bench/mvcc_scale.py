"""Scale on the private cluster: the claim rate with a huge ready backlog against a small
one (plain and fair queue with many tenants), and 1..16 worker processes draining one
backlog, with CPU per message (workers and server) and connection counts."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import psycopg

from . import core_cases, raw
from .config import QUEUE, TASK, payload
from .context import Context
from .mvcc import cpu_seconds, server_pids
from .workers import COPY_MESSAGES, Worker, last_ack_at, load_and_release, wait_drained

FAIR_QUEUE = "bench_fair"  # FAIRNESS on in bench/settings.py
COPY_FAIR = "COPY pgqueue_message (queue, task, payload, tenant) FROM STDIN"
CLAIM_BATCH = 100
FAIR_ROUND = 100  # messages a tenant adds to the fair backlog per turn


def _copy(conn: psycopg.Connection[Any], n: int, tenants: int = 0) -> None:
    """``n`` ready messages by COPY, in chunks (a fair queue's through enqueue_many, which
    gives every message its place in the fair order: in rounds of at most 100 a tenant, as
    a backlog builds up while tenants take turns, so the fair order's index grows at its end)."""
    if tenants:
        from django_pgqueue import enqueue_many

        per_tenant = max(1, n // tenants)
        for first in range(0, per_tenant, FAIR_ROUND):
            size = min(FAIR_ROUND, per_tenant - first)
            for k in range(tenants):
                start = k * per_tenant + first
                bodies = (payload(i) for i in range(start, start + size))
                enqueue_many(TASK, bodies, queue=FAIR_QUEUE, tenant=f"t{k}")
        return
    chunk = 200_000
    for start in range(0, n, chunk):
        with conn.transaction(), conn.cursor() as cur, cur.copy(COPY_MESSAGES) as copy:
            for i in range(start, min(n, start + chunk)):
                copy.write_row((QUEUE, TASK, json.dumps(payload(i))))


def _claim_rate(measured: int, queue: str) -> float:
    core_cases.warm_up()
    t0 = time.perf_counter()
    done = core_cases.lease_complete_drain(CLAIM_BATCH, limit=measured, queue=queue)
    return done / (time.perf_counter() - t0)


def _small_rate(conn: psycopg.Connection[Any], small: int, measured: int, tenants: int) -> float:
    """Rate with ``small`` ready: reloaded whenever drained, until ``measured`` are done."""
    queue = FAIR_QUEUE if tenants else QUEUE
    done, seconds = 0, 0.0
    while done < measured:
        core_cases.reset()
        _copy(conn, small, min(tenants, small))
        conn.execute("ANALYZE pgqueue_message")
        core_cases.warm_up()
        t0 = time.perf_counter()
        done += core_cases.lease_complete_drain(CLAIM_BATCH, queue=queue)
        seconds += time.perf_counter() - t0
    return done / seconds


def backlog(ctx: Context, big: int, small: int, measured: int, tenants: int) -> dict[str, Any]:
    """Claim + complete rate (batch 100, in-process) with ``big`` ready over ``small`` ready."""
    with raw.connect(ctx.dsn) as conn:
        small_rate = _small_rate(conn, small, measured, tenants)
        core_cases.reset()
        t0 = time.perf_counter()
        _copy(conn, big, tenants)
        load_s = time.perf_counter() - t0
        conn.execute("VACUUM ANALYZE pgqueue_message")
        size = conn.execute("SELECT pg_total_relation_size('pgqueue_message')").fetchone()
        big_rate = _claim_rate(measured, FAIR_QUEUE if tenants else QUEUE)
        core_cases.reset()
    return {
        "tenants": tenants,
        "small": small,
        "big": big,
        "measured": measured,
        "small_rate": small_rate,
        "big_rate": big_rate,
        "ratio": big_rate / small_rate,
        "load_seconds": load_s,
        "table_mib": (size[0] if size else 0) / 2**20,
    }


class ConnectionCounter:
    """The most sessions of the bench database seen, counted every half second."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        with raw.connect(self.dsn) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchone()
                self.peak = max(self.peak, int(row[0]) if row else 0)
                self._stop.wait(0.5)


def many_workers(ctx: Context, counts: list[int], n: int) -> list[dict[str, Any]]:
    """For each count: that many pgq_worker processes drain ``n`` messages released at once."""
    out = []
    for count in counts:
        with raw.connect(ctx.dsn) as watch, psycopg.connect(ctx.dsn) as loader:
            core_cases.reset()
            procs = [Worker(ctx, 4, 100, f"pgq-worker-scale-{count}-{k}") for k in range(count)]
            counter = ConnectionCounter(ctx.dsn)
            try:
                procs[0].wait_ready(watch)
                _wait_registered(watch, f"pgq-worker-scale-{count}-", count)
                core_cases.reset()
                counter.start()
                server = server_pids(watch)
                workers = [p.pid for p in procs]
                cpu0 = cpu_seconds(workers), cpu_seconds(server)
                t0 = load_and_release(loader, n, 0)
                wait_drained(watch, timeout=1200)
                seconds = last_ack_at(watch) - t0
                cpu1 = cpu_seconds(workers), cpu_seconds(server)
            finally:
                counter.stop()
                for p in procs:
                    p.stop()
        out.append(
            {
                "workers": count,
                "n": n,
                "seconds": seconds,
                "rate": n / seconds,
                "worker_cpu_ms_per_msg": (cpu1[0] - cpu0[0]) * 1000 / n,
                "server_cpu_ms_per_msg": (cpu1[1] - cpu0[1]) * 1000 / n,
                "connections_peak": counter.peak,
            }
        )
    return out


def _wait_registered(conn: psycopg.Connection[Any], prefix: str, count: int) -> None:
    """Every worker has written its heartbeat row (so it is connected and listening)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) FROM pgqueue_worker WHERE starts_with(worker_id, %s)", [prefix]
        ).fetchone()
        if row and int(row[0]) >= count:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{count} workers did not all register")
