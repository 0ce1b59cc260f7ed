"""Scale on the private cluster: the claim rate with a huge ready backlog against a small
one (plain and fair queue with many tenants), and 1..16 worker processes draining one
backlog, with CPU per message (workers and server) and connection counts; the peers
(PgQueuer, Procrastinate) in both, each through its own worker."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from . import core_cases, raw
from .config import QUEUE, TASK, payload
from .context import Context
from .mvcc import (
    PEER_WORKER_ARG,
    PEER_WORKER_LABEL,
    PGQ_WORKER_LABEL,
    SHAPES,
    cpu_seconds,
    server_pids,
)
from .peers.runner import PEERS, Adapter, call_all
from .pg import scalar
from .scenarios import FAIR_QUEUE, PGQ
from .workers import COPY_MESSAGES, Worker, last_ack_at, load_and_release, wait_drained

CLAIM_BATCH = 100
FAIR_ROUND = 100  # messages a tenant adds to the fair backlog per turn


def load_ready(conn: psycopg.Connection[Any], n: int, tenants: int = 0) -> None:
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


# What the server wrote while a claim rate was timed: WAL (exact, from the insert position,
# over the timed spells only), its full-page images (a page's first change after a checkpoint
# writes the whole page) and the checkpoints started (over the whole phase: backends report
# these up to a second late, so the phase is read a little after its last spell).
_LSN = "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
_FPI = "SELECT wal_fpi FROM pg_stat_wal"
_CHECKPOINTS = {
    True: "SELECT num_timed + num_requested FROM pg_stat_checkpointer",  # PostgreSQL 17+
    False: "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter",
}
STATS_DELAY = 2.0


class WalCounter:
    """``with WalCounter(conn) as wal:`` around a phase, ``with wal.timing():`` around each
    timed spell in it; then ``wal.per_message(done)``."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.wal_bytes = 0.0
        self.fpi = 0
        self.checkpoints = 0
        newer = self._value("SELECT (to_regclass('pg_stat_checkpointer') IS NOT NULL)::int")
        self._checkpoints_sql = _CHECKPOINTS[bool(newer)]

    def _value(self, sql: str) -> float:
        return float(scalar(self.conn, sql))

    def _counters(self) -> tuple[int, int]:
        time.sleep(STATS_DELAY)
        return int(self._value(_FPI)), int(self._value(self._checkpoints_sql))

    def __enter__(self) -> WalCounter:
        self._start = self._counters()
        return self

    def __exit__(self, *exc: object) -> None:
        fpi, checkpoints = self._counters()
        self.fpi = fpi - self._start[0]
        self.checkpoints = checkpoints - self._start[1]

    @contextmanager
    def timing(self) -> Iterator[None]:
        before = self._value(_LSN)
        yield
        self.wal_bytes += self._value(_LSN) - before

    def per_message(self, done: int) -> dict[str, float]:
        return {
            "wal_kib_per_msg": self.wal_bytes / 1024 / done,
            "fpi_per_msg": self.fpi / done,
            "checkpoints": self.checkpoints,
        }


# The walk a fair claim starts with (the fair head in core/_flow_sql.py), without locking.
_FAIR_HEAD_WALK = (
    "SELECT m.id FROM pgqueue_message m WHERE m.queue = %s AND m.fair_order >= 0 "
    "ORDER BY m.priority DESC, m.fair_order, m.id LIMIT %s"
)


def head_walk_buffers(conn: psycopg.Connection[Any], queue: str, fair: bool) -> int:
    """Shared buffers (hit or read) of one walk of the first 100 entries of ``queue``'s claim
    order, fair or plain (the plain one as the worker's head watcher reads it). They grow with
    the dead index entries at its head: one per message processed since the last vacuum."""
    from django_pgqueue.core import _claim_sql

    if fair:
        return plan_buffers(conn, _FAIR_HEAD_WALK, [queue, CLAIM_BATCH])
    return plan_buffers(conn, _claim_sql.HEAD_OF_QUEUE, {"queue": queue, "rows": CLAIM_BATCH})


def plan_buffers(
    conn: psycopg.Connection[Any], statement: str, params: Sequence[Any] | Mapping[str, Any]
) -> int:
    """Shared buffers (hit or read) of one run of ``statement``, from its EXPLAIN ANALYZE."""
    row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params).fetchone()
    plan = (json.loads(row[0]) if isinstance(row[0], str) else row[0])[0]["Plan"] if row else {}
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


def _claim_rate(
    conn: psycopg.Connection[Any], measured: int, queue: str
) -> tuple[float, dict[str, float]]:
    core_cases.warm_up()
    with WalCounter(conn) as wal, wal.timing():
        t0 = time.perf_counter()
        done = core_cases.lease_complete_drain(CLAIM_BATCH, limit=measured, queue=queue)
        seconds = time.perf_counter() - t0
    return done / seconds, wal.per_message(done)


def _small_rate(
    conn: psycopg.Connection[Any], small: int, measured: int, tenants: int
) -> tuple[float, dict[str, float]]:
    """Rate with ``small`` ready: reloaded whenever drained, until ``measured`` are done. The
    reloads go on top of what was processed, as in a queue that lives on (no truncation in
    between): the claims of both timings pass the dead entries of as many messages."""
    queue = FAIR_QUEUE if tenants else QUEUE
    done, seconds = 0, 0.0
    core_cases.reset()
    with WalCounter(conn) as wal:
        while done < measured:
            load_ready(conn, small, min(tenants, small))
            conn.execute("ANALYZE pgqueue_message")
            core_cases.warm_up()
            with wal.timing():
                t0 = time.perf_counter()
                done += core_cases.lease_complete_drain(CLAIM_BATCH, queue=queue)
                seconds += time.perf_counter() - t0
    return done / seconds, wal.per_message(done)


def backlog(ctx: Context, big: int, small: int, measured: int, tenants: int) -> dict[str, Any]:
    """Claim + complete rate (batch 100, in-process, with a claimer's bounds as a worker's) with
    ``big`` ready over ``small`` ready."""
    queue = FAIR_QUEUE if tenants else QUEUE
    with raw.connect(ctx.dsn) as conn:
        small_rate, small_wal = _small_rate(conn, small, measured, tenants)
        small_head = head_walk_buffers(conn, queue, bool(tenants))
        core_cases.reset()
        t0 = time.perf_counter()
        load_ready(conn, big, tenants)
        load_s = time.perf_counter() - t0
        conn.execute("VACUUM ANALYZE pgqueue_message")
        # The load's and the vacuum's own writes are flushed before the timing, not during it.
        conn.execute("CHECKPOINT")
        size = scalar(conn, "SELECT pg_total_relation_size('pgqueue_message')")
        big_rate, big_wal = _claim_rate(conn, measured, queue)
        big_head = head_walk_buffers(conn, queue, bool(tenants))
        core_cases.reset()
    return {
        "system": PGQ,
        "worker": "lease() with bounds + complete(), batch 100, in-process",
        "tenants": tenants,
        "small": small,
        "big": big,
        "measured": measured,
        "timed": measured,
        "small_rate": small_rate,
        "big_rate": big_rate,
        "ratio": big_rate / small_rate,
        "wal": {"small": small_wal, "big": big_wal},
        "head_walk_buffers": {"small": small_head, "big": big_head},
        "load_seconds": load_s,
        "table_mib": size / 2**20,
    }


SESSIONS = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


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
                sessions = scalar(conn, SESSIONS)
                self.peak = max(self.peak, int(sessions))
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
                workers = [p.pid for p in procs]
                cpu0 = _cpu(watch, workers)
                t0 = load_and_release(loader, n, 0)
                wait_drained(watch, timeout=1200)
                seconds = last_ack_at(watch) - t0
                cpu1 = _cpu(watch, workers)
            finally:
                counter.stop()
                for p in procs:
                    p.stop()
        out.append(_workers_row(PGQ, PGQ_WORKER_LABEL, count, n, seconds, cpu0, cpu1, counter))
    return out


def _cpu(watch: psycopg.Connection[Any], workers: list[int]) -> tuple[float, float]:
    """CPU seconds so far of the workers and of the cluster. Its processes are listed anew
    each time: a backend that came and went in between is in the postmaster's count."""
    return cpu_seconds(workers), cpu_seconds(server_pids(watch))


def _workers_row(
    system: str,
    worker: str,
    count: int,
    n: int,
    seconds: float,
    cpu0: tuple[float, float],
    cpu1: tuple[float, float],
    counter: ConnectionCounter,
) -> dict[str, Any]:
    return {
        "system": system,
        "worker": worker,
        "workers": count,
        "n": n,
        "seconds": seconds,
        "rate": n / seconds,
        "worker_cpu_ms_per_msg": (cpu1[0] - cpu0[0]) * 1000 / n,
        "server_cpu_ms_per_msg": (cpu1[1] - cpu0[1]) * 1000 / n,
        "connections_peak": counter.peak,
    }


REGISTERED = "SELECT count(*) FROM pgqueue_worker WHERE starts_with(worker_id, %s)"


def _wait_registered(conn: psycopg.Connection[Any], prefix: str, count: int) -> None:
    """Every worker has written its heartbeat row (so it is connected and listening)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if scalar(conn, REGISTERED, [prefix]) >= count:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{count} workers did not all register")


# --- the peers ---------------------------------------------------------------------------

# Each peer's own drain in the backlog case: the adapter's argument and its label.
PEER_BACKLOG_WORKER = {
    "pgqueuer": ("100", "QueueManager drain, batch_size 100"),
    "procrastinate": ("4", "worker concurrency 4, wait=False"),
}
COPY_CHUNK = 1_000_000  # rows a transaction of the bulk copy
SLOW_MIN = 1_000  # the fewest messages a slow peer is timed on
IDLE_RUNS = 5


@dataclass(frozen=True)
class PeerJobs:
    """What the scale cases read and write of a peer's tables besides its jobs table."""

    finished_sql: str  # when its newest job finished: database clock, epoch seconds
    # The table its row triggers write a 'deferred' event to for every job (Procrastinate).
    events_table: str = ""


PEER_JOBS = {
    "pgqueuer": PeerJobs(
        "SELECT extract(epoch FROM max(created))::float8 FROM pgqueuer_log "
        "WHERE status = 'successful'"
    ),
    "procrastinate": PeerJobs(
        "SELECT extract(epoch FROM max(at))::float8 FROM procrastinate_events "
        "WHERE type = 'succeeded'",
        events_table="procrastinate_events",
    ),
}


def peer_backlog(ctx: Context, name: str, big: int, small: int, measured: int) -> dict[str, Any]:
    """Ours' plain case for a peer, through its own drain (PEER_BACKLOG_WORKER) stopped after
    ``measured`` jobs (Procrastinate, a few hundred jobs/s here, a tenth, at least 1,000)."""
    arg, label = PEER_BACKLOG_WORKER[name]
    if PEERS[name].slow:
        measured = min(big, max(SLOW_MIN, measured // 10))
    table = SHAPES[name].live_table
    drain = OwnDrain(Adapter(ctx, PEERS[name], f"{name}-backlog"), arg)
    try:
        with raw.connect(ctx.dsn) as conn:
            drain.adapter.call("reset")
            drain.measure_idle()
            small_n, small_s = _peer_small(conn, drain, table, small, measured)
            drain.adapter.call("reset")
            t0 = time.perf_counter()
            _load_copies(conn, drain.adapter, name, big)
            load_s = time.perf_counter() - t0
            size = scalar(conn, "SELECT pg_total_relation_size(%s)", [table])
            big_n, big_s = drain.take(measured)
            drain.adapter.call("reset")
    finally:
        drain.adapter.close()
    return {
        "system": PEERS[name].system,
        "worker": label,
        "tenants": 0,
        "small": small,
        "big": big,
        "measured": measured,
        "timed": big_n,
        "small_rate": small_n / small_s,
        "big_rate": big_n / big_s,
        "ratio": (big_n / big_s) / (small_n / small_s),
        "load_seconds": load_s,
        "table_mib": size / 2**20,
        "idle_seconds": drain.idle,
    }


@dataclass
class OwnDrain:
    """A peer's own drain in its adapter (``take``: it stops after ``n`` jobs or at an empty
    queue and says how many it ran, a batch more at most). Its worker starts and stops
    around every run, where ours is timed warm (PgQueuer's takes ~50 ms here, a quarter of a
    1,000-job drain): the median time of a drain of an empty queue is taken off each."""

    adapter: Adapter
    arg: str  # the adapter's worker setting
    idle: float = 0.0

    def measure_idle(self) -> None:
        runs = [self.adapter.call("take", 1, self.arg)["seconds"] for _ in range(IDLE_RUNS)]
        self.idle = statistics.median(runs)

    def take(self, n: int) -> tuple[int, float]:
        """(jobs run, seconds)."""
        out = self.adapter.call("take", n, self.arg)
        return int(out["n"]), out["seconds"] - self.idle


def _peer_small(
    conn: psycopg.Connection[Any], drain: OwnDrain, table: str, small: int, measured: int
) -> tuple[int, float]:
    """(jobs, seconds) with ``small`` ready, loaded through the peer's batch API whenever
    drained, until ``measured`` are done: on top of what it processed, as ours."""
    done, seconds = 0, 0.0
    drain.adapter.call("reset")
    while done < measured:
        drain.adapter.call("load", small, 0)
        conn.execute(f"ANALYZE {table}")
        n, s = drain.take(small)
        done, seconds = done + n, seconds + s
    return done, seconds


def _load_copies(conn: psycopg.Connection[Any], adapter: Adapter, name: str, n: int) -> None:
    """``n`` ready jobs of the peer's: one enqueued through its API, copied server-side in
    transactions of a million (its API runs a few thousand a second at best), then VACUUM
    ANALYZE as for ours. Every copy has the seed's values but its id: the same task and
    queue, no lock or dedupe key (those indexes are unique)."""
    table = SHAPES[name].live_table
    events = PEER_JOBS[name].events_table
    adapter.call("load", 1, 0)
    columns = _columns(conn, table)
    seed = scalar(conn, f"SELECT min(id) FROM {table}")
    copy = (
        f"INSERT INTO {table} ({columns}) SELECT {columns} "
        f"FROM {table}, generate_series(1, %s) WHERE id = %s"
    )
    if events:
        copy = (
            f"WITH copies AS ({copy} RETURNING id) "
            f"INSERT INTO {events} (job_id, type) SELECT id, 'deferred' FROM copies"
        )
    with _user_triggers_off(conn, table, bool(events)):
        for start in range(1, n, COPY_CHUNK):
            conn.execute(copy, [min(COPY_CHUNK, n - start), seed])
    for analyzed in (table, events) if events else (table,):
        conn.execute(f"VACUUM ANALYZE {analyzed}")


def _columns(conn: psycopg.Connection[Any], table: str) -> str:
    """Every column of ``table`` but its id, from the catalog."""
    return str(
        scalar(
            conn,
            "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
            "AND attname <> 'id'",
            [table],
        )
    )


@contextmanager
def _user_triggers_off(conn: psycopg.Connection[Any], table: str, off: bool) -> Iterator[None]:
    """Procrastinate's row triggers send two NOTIFYs and write a 'deferred' event for every
    job. With them on, a million copies take twice as long here (39 s against 21 s) and the
    loading backend holds two million NOTIFYs that nobody listens to; so they are off during
    the bulk copy only, which writes the events itself."""
    if not off:
        yield
        return
    conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
    try:
        yield
    finally:
        conn.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")


def peer_workers(ctx: Context, name: str, counts: list[int], n: int) -> list[dict[str, Any]]:
    """``many_workers`` for a peer: for each count, that many worker processes of its own
    (one adapter each, as in the offered-load runs) drain ``n`` jobs loaded before they
    start (Procrastinate, a few hundred jobs/s here, a twentieth, at least 1,000)."""
    if PEERS[name].slow:
        n = max(SLOW_MIN, n // 20)
    return [_peer_drain(ctx, name, count, n) for count in counts]


def _peer_drain(ctx: Context, name: str, count: int, n: int) -> dict[str, Any]:
    """The adapters start and connect first; then all are sent ``drain`` at once. The time
    runs from then (the database clock) to the newest job's finish in the peer's tables."""
    peer = PEERS[name]
    loader = Adapter(ctx, peer, f"{name}-scale-loader")
    try:
        loader.call("reset")
        loader.call("load", n, 0)
    finally:
        loader.close()
    adapters: list[Adapter] = []
    counter = ConnectionCounter(ctx.dsn)
    try:
        for k in range(count):
            adapters.append(Adapter(ctx, peer, f"{name}-scale-{count}-{k}"))
        workers = [a.proc.pid for a in adapters]
        with raw.connect(ctx.dsn) as watch:
            counter.start()
            cpu0 = _cpu(watch, workers)
            t0 = scalar(watch, "SELECT extract(epoch FROM clock_timestamp())::float8")
            done = sum(
                int(out["n"]) for out in call_all(adapters, "drain", n, PEER_WORKER_ARG[name])
            )
            cpu1 = _cpu(watch, workers)
            seconds = scalar(watch, PEER_JOBS[name].finished_sql) - t0
    finally:
        counter.stop()
        for a in adapters:
            a.close()
    row = _workers_row(
        peer.system, PEER_WORKER_LABEL[name], count, done, seconds, cpu0, cpu1, counter
    )
    return {**row, "loaded": n}
