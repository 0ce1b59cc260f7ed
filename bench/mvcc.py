"""Throughput under MVCC pressure: a queue that runs for a long time at a steady offered load,
with autovacuum on, with and without a transaction holding a snapshot open, side by side
with the peers. Each system, in turn: its workers start, capacity is measured (producers
flat out), then producers offer ``load`` x capacity for the run while a sampler reads the
backlog every second and, every ``sample`` seconds, dead tuples, index sizes and the claim
statement's buffers (``pg_stat_statements``). See docs/benchmarks.md.

The systems share the run's database (each its own tables); a snapshot is held only during
its own system's run.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from . import raw
from .config import QUEUE
from .context import Context
from .measure import percentile, wait_until
from .peers.runner import PEERS, Adapter, call_all
from .pg import scalar
from .scenarios import PGQ, Producers
from .workers import Worker

PRODUCERS = 2  # producer processes per system; each offers half the load
BACKLOG_TICK = 1.0  # seconds between backlog counts (recovery is read from these)


@dataclass(frozen=True)
class Shape:
    """What the sampler reads for one system: its tables and its claim statement."""

    system: str
    tag: str  # the handlers' UDP tag
    tables: str  # LIKE pattern of its tables' names
    live_table: str  # the one its claims read (archives and logs grow by design)
    backlog_sql: str
    claim_like: tuple[str, ...]  # every pattern matches the claim's text in pg_stat_statements
    statements_like: str  # pattern of every statement of the system (its table's name)


# fmt: off
SHAPES = {
    "pgq": Shape(
        PGQ, "pgq", r"pgqueue\_%", "pgqueue_message", "SELECT count(*) FROM pgqueue_message",
        ("%UPDATE pgqueue_message m%", "%gen_random_uuid()%", "%leased_by%"),
        r"%pgqueue\_message%",
    ),
    "pgqueuer": Shape(
        "PgQueuer", "pgqueuer", "pgqueuer%", "pgqueuer",
        "SELECT count(*) FROM pgqueuer WHERE status = 'queued'",
        ("%UPDATE%pgqueuer%", "%picked%"), "%pgqueuer%",
    ),
    "procrastinate": Shape(
        "Procrastinate", "procrastinate", "procrastinate%", "procrastinate_jobs",
        "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
        ("%procrastinate_fetch_job%",), "%procrastinate%",
    ),
}
# fmt: on

# Each peer's worker setting in these runs (the adapter's serve_latency argument).
PEER_WORKER_ARG = {"pgqueuer": "10", "procrastinate": "4"}
PEER_WORKER_LABEL = {
    "pgqueuer": "QueueManager, batch_size 10",
    "procrastinate": "worker concurrency 4",
}
PGQ_WORKER_LABEL = "pgq_worker --concurrency 4 --batch-size 100"


@dataclass(frozen=True)
class Plan:
    seconds: float  # the offered-load run
    sample: float  # seconds between the heavier samples
    load: float  # offered load, fraction of the measured capacity
    snapshot: bool  # hold a REPEATABLE READ snapshot over the middle half
    capacity_n: int  # messages per producer in the capacity measurement
    enqueue_batch: int = 10  # messages per enqueue call (each system's batch API)
    rate: float = 0.0  # offered msgs/s for every system instead of load x its capacity
    export_dir: Path | None = None  # run pgq_pipeline export over the middle half (ours)
    export_cpu: str = "normal"  # the export's CPU priority, a key of EXPORT_CPU
    export_every: float = 0.0  # seconds between the passes of one --every export; 0: a process each
    export_max_ranges: int = 0  # --max-ranges of each pass; 0: all

    @property
    def window(self) -> tuple[float, float]:
        """The middle half of the run: when the snapshot is held."""
        return self.seconds * 0.25, self.seconds * 0.75


# --- the systems -------------------------------------------------------------------------


class Ours:
    """pgq_worker and bench.producer processes (enqueue(), NOTIFY on)."""

    shape = SHAPES["pgq"]
    worker_label = PGQ_WORKER_LABEL

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.worker: Worker | None = None
        self.producers: Producers | None = None

    def start(self, watch: psycopg.Connection[Any]) -> None:
        from . import core_cases

        core_cases.reset()
        self.worker = Worker(self.ctx, 4, 100, "pgq-worker-mvcc")
        self.worker.wait_ready(watch)
        self.producers = Producers(self.ctx, PRODUCERS)

    def produce(self, n_each: int, rate_each: float, batch: int) -> None:
        assert self.producers is not None
        self.producers.run("pgq", n_each, 0, rate_each, latency=True, batch=batch)

    def worker_pids(self) -> list[int]:
        return [self.worker.pid] if self.worker else []

    def stop(self) -> None:
        if self.producers is not None:
            self.producers.close()
        if self.worker is not None:
            self.worker.stop()


class Peer:
    """A peer's worker adapter (serve_latency) and producer adapters (trickle)."""

    def __init__(self, ctx: Context, name: str) -> None:
        self.ctx = ctx
        self.peer = PEERS[name]
        self.name = name
        self.shape = SHAPES[name]
        self.worker_label = PEER_WORKER_LABEL[name]
        self.worker: Adapter | None = None
        self.producers: list[Adapter] = []

    def start(self, watch: psycopg.Connection[Any]) -> None:
        self.worker = Adapter(self.ctx, self.peer, f"{self.name}-mvcc-worker")
        self.worker.call("reset")
        self.worker.call("serve_latency", PEER_WORKER_ARG[self.name])
        self.producers = [
            Adapter(self.ctx, self.peer, f"{self.name}-mvcc-producer-{k}") for k in range(PRODUCERS)
        ]

    def produce(self, n_each: int, rate_each: float, batch: int) -> None:
        call_all(self.producers, "trickle", n_each, rate_each, batch)

    def worker_pids(self) -> list[int]:
        return [self.worker.proc.pid] if self.worker else []

    def stop(self) -> None:
        for p in self.producers:
            p.close()
        if self.worker is not None:
            try:
                self.worker.call("stop_latency")
            except Exception:
                pass
            self.worker.close()


System = Ours | Peer


# --- sampling ----------------------------------------------------------------------------

TABLE_STATS = """
SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count,
       pg_relation_size(relid),
       (SELECT COALESCE(sum(pg_relation_size(indexrelid)), 0)::bigint
        FROM pg_index WHERE indrelid = relid)
FROM pg_stat_user_tables WHERE relname LIKE %s ORDER BY relname
"""

INDEX_SIZES = """
SELECT indexrelname, pg_relation_size(indexrelid)
FROM pg_stat_user_indexes WHERE relname LIKE %s ORDER BY indexrelname
"""


def claim_counters(conn: psycopg.Connection[Any], patterns: tuple[str, ...]) -> tuple[int, int]:
    """(calls, shared buffers hit + read) of the claim statement(s), cumulative."""
    where = " AND ".join(["query LIKE %s"] * len(patterns))
    row = conn.execute(
        "SELECT COALESCE(sum(calls), 0)::bigint, "
        "COALESCE(sum(shared_blks_hit + shared_blks_read), 0)::bigint "
        f"FROM pg_stat_statements WHERE toplevel AND {where}",
        list(patterns),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


# Every statement of the system but the harness's own (its counts, EXPLAINs, statistics).
SYSTEM_BUFFERS = r"""
SELECT COALESCE(sum(shared_blks_hit + shared_blks_read), 0)::bigint FROM pg_stat_statements
WHERE toplevel AND query LIKE %s AND query NOT LIKE 'SELECT count(*) FROM%%'
  AND query NOT LIKE 'EXPLAIN%%' AND query NOT LIKE '%%pg\_stat%%'
"""


def system_buffers(conn: psycopg.Connection[Any], pattern: str) -> int:
    return int(scalar(conn, SYSTEM_BUFFERS, [pattern]))


# What the cluster's client backends are doing, at one look: the export's (its COPY of a range)
# apart from the rest (the queue's). An active backend with no wait event is on a CPU or
# waiting for one.
WAITS = """
SELECT CASE WHEN query ILIKE 'copy%%' THEN 'export' ELSE 'queue' END,
       COALESCE(wait_event_type || ':' || wait_event, 'running'), count(*)
FROM pg_stat_activity
WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid()
GROUP BY 1, 2
"""


def top_statements(conn: psycopg.Connection[Any], limit: int = 12) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT calls, rows, shared_blks_hit + shared_blks_read, left(query, 300) "
        "FROM pg_stat_statements WHERE toplevel "
        "ORDER BY shared_blks_hit + shared_blks_read DESC LIMIT %s",
        [limit],
    ).fetchall()
    return [{"calls": c, "rows": r, "buffers": b, "query": q} for c, r, b, q in rows]


@dataclass
class Sampler:
    """Reads the backlog every second and the heavier figures every ``sample`` seconds, on
    its own connection, until stopped."""

    dsn: str
    shape: Shape
    sample: float
    #: The system's worker processes, whose CPU each sample reads.
    worker_pids: list[int] = field(default_factory=list)
    t0: float = field(default_factory=time.time)
    backlog: list[tuple[float, int]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    #: The running export, whose process tree's CPU each sample reads.
    exporter: Exporter | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    # Backends seen in each state (``WAITS``) over all looks so far, and the looks.
    _waits: dict[str, int] = field(default_factory=dict)
    _looks: int = 0
    # The export's processes' own CPU seconds, as last read: one that ended keeps its figure.
    _export_cpu: dict[int, float] = field(default_factory=dict)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        with raw.connect(self.dsn) as conn:
            next_heavy = 0.0
            while not self._stop.is_set():
                now = time.time() - self.t0
                self.backlog.append((now, _backlog(conn, self.shape)))
                self._looks += 1
                for who, what, count in conn.execute(WAITS).fetchall():
                    key = f"{who} {what}"
                    self._waits[key] = self._waits.get(key, 0) + int(count)
                if now >= next_heavy:
                    self.samples.append(self.heavy(conn, now))
                    next_heavy = now + self.sample
                self._stop.wait(BACKLOG_TICK)

    def export_cpu_seconds(self) -> float:
        """CPU seconds of the export's processes so far, each as last seen alive (a process
        that lived between two samples is missed)."""
        if self.exporter is not None:
            for pid in self.exporter.pids():
                self._export_cpu[pid] = cpu_seconds([pid], children=False)
        return sum(self._export_cpu.values())

    def heavy(self, conn: psycopg.Connection[Any], now: float) -> dict[str, Any]:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        tables = conn.execute(TABLE_STATS, [self.shape.tables]).fetchall()
        indexes = conn.execute(INDEX_SIZES, [self.shape.tables]).fetchall()
        calls, buffers = claim_counters(conn, self.shape.claim_like)
        return {
            "t": now,
            # CPU seconds so far: the cluster's processes, the worker's, the export's, the
            # machine's (busy, and idle waiting for the disk).
            "server_cpu": cpu_seconds(server_pids(conn)),
            "worker_cpu": cpu_seconds(self.worker_pids),
            "export_cpu": self.export_cpu_seconds(),
            **machine_seconds(),
            **disk_counters(),
            "waits": dict(self._waits),
            "wait_looks": self._looks,
            "tables": {
                name: {
                    "live": live,
                    "dead": dead,
                    "autovacuums": vacuums,
                    "autoanalyzes": analyzes,
                    "heap_bytes": heap,
                    "index_bytes": idx,
                }
                for name, live, dead, vacuums, analyzes, heap, idx in tables
            },
            "indexes": dict(indexes),
            "claim_calls": calls,
            "claim_buffers": buffers,
            "system_buffers": system_buffers(conn, self.shape.statements_like),
        }


# --- one system's run --------------------------------------------------------------------


def _pairs(ctx: Context, tag: str) -> list[tuple[float, float]]:
    """(arrival time, enqueue -> start ms) of every report so far."""
    times = list(ctx.udp.arrivals.get(tag, []))
    ms = ctx.udp.tagged.get(tag, [])[: len(times)]
    return list(zip(times[: len(ms)], ms, strict=True))


def measure_capacity(ctx: Context, system: System, plan: Plan) -> float:
    """Processed per second, producers flat out: from the first to the last report, so
    whichever of enqueue or claim is slower on this machine bounds it. A peer that runs a
    few dozen jobs/s gets a tenth of the messages."""
    slow = isinstance(system, Peer) and system.peer.slow
    n_each = max(100, plan.capacity_n // 10) if slow else plan.capacity_n
    ctx.udp.reset()
    system.produce(n_each, 1e9, plan.enqueue_batch)
    total = PRODUCERS * n_each
    wait_until(lambda: ctx.udp.count(system.shape.tag) >= total, 300, 0.2)
    times = sorted(ctx.udp.arrivals.get(system.shape.tag, []))
    if len(times) < 2 or times[-1] <= times[0]:
        raise RuntimeError(f"{system.shape.system}: no throughput measured")
    return len(times) / (times[-1] - times[0])


class SnapshotHolder:
    """A REPEATABLE READ transaction that reads once and then idles: a report, a pg_dump."""

    def __init__(self, dsn: str, table_sql: str) -> None:
        self.conn = psycopg.connect(dsn)
        self.conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        self.conn.execute(table_sql)

    def release(self) -> None:
        self.conn.commit()
        self.conn.close()


def cpu_seconds(pids: list[int], *, children: bool = True) -> float:
    """utime + stime of processes (and, with ``children``, of their reaped children),
    seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += sum(int(x) for x in fields[11 : 15 if children else 13])
    return total / tick


def process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def server_pids(conn: psycopg.Connection[Any]) -> list[int]:
    """The private cluster's processes: the postmaster and its children."""
    pid_file = Path(scalar(conn, "SHOW data_directory")) / "postmaster.pid"
    return process_tree(int(pid_file.read_text().split()[0]))


def machine_seconds() -> dict[str, float]:
    """CPU seconds this machine's cores (all of them, all processes) have been busy, and idle
    with a disk request outstanding (iowait), so far: /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle, iowait = fields[3], fields[4]
    return {
        "machine_busy": (sum(fields[:8]) - idle - iowait) / tick,
        "machine_iowait": iowait / tick,
    }


SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own size


def disk_counters() -> dict[str, float]:
    """Bytes read and written, and seconds with a request in flight, of this machine's disks
    (whole devices, not their partitions) so far: /proc/diskstats."""
    read = written = busy_ms = 0
    for line in Path("/proc/diskstats").read_text().splitlines():
        fields = line.split()
        name = fields[2]
        if name.startswith(("loop", "ram")) or not Path(f"/sys/block/{name}").exists():
            continue
        read += int(fields[5]) * SECTOR
        written += int(fields[9]) * SECTOR
        busy_ms += int(fields[12])
    return {"disk_read": read, "disk_written": written, "disk_busy": busy_ms / 1000}


def run_system(ctx: Context, name: str, plan: Plan) -> dict[str, Any]:
    """One system through capacity, then the offered load; returns its figures and series."""
    system: System = Ours(ctx) if name == "pgq" else Peer(ctx, name)
    shape = system.shape
    with raw.connect(ctx.dsn) as watch:
        system.start(watch)
        export: Exporter | None = None
        try:
            capacity = measure_capacity(ctx, system, plan)
            wait_until(lambda: _backlog(watch, shape) == 0, 120, 0.5)
            if plan.export_dir and name == "pgq":
                Exporter.check(ctx, plan.export_dir, ExportHow(cpu=plan.export_cpu))
            watch.execute("SELECT pg_stat_statements_reset()")
            offered = plan.rate or plan.load * capacity
            n_each = max(1, int(offered / PRODUCERS * plan.seconds))
            ctx.udp.reset()
            sampler = Sampler(ctx.dsn, shape, plan.sample, system.worker_pids())
            producing = threading.Thread(
                target=system.produce,
                args=(n_each, offered / PRODUCERS, plan.enqueue_batch),
                daemon=True,
            )
            sampler.t0 = time.time()
            sampler.start()
            producing.start()
            holder = None
            snapshot_at = commit_at = None
            begin, end = plan.window
            if plan.snapshot or plan.export_dir:
                _sleep_until(sampler.t0 + begin)
                if plan.snapshot:
                    holder = SnapshotHolder(ctx.dsn, shape.backlog_sql)
                if plan.export_dir and name == "pgq":
                    how = ExportHow(plan.export_cpu, plan.export_every, plan.export_max_ranges)
                    export = sampler.exporter = Exporter(ctx, plan.export_dir, how)
                snapshot_at = time.time() - sampler.t0
                explain_calm = explain_claim(watch, system)
                _sleep_until(sampler.t0 + end)
                explain_during = explain_claim(watch, system)
                if holder is not None:
                    holder.release()
                if export is not None:
                    export.stop()
                    if export.failed:
                        raise RuntimeError(
                            f"pgq_pipeline export failed {export.failed} times: see "
                            f"logs/{Exporter.LOG}.log in the results folder"
                        )
                commit_at = time.time() - sampler.t0
            producing.join()
            produced_until = time.time() - sampler.t0
            wait_until(lambda: _backlog(watch, shape) == 0, 120, 0.5)
            sampler.stop()
            statements = top_statements(watch)
        finally:
            if export is not None:
                export.stop()
            system.stop()
    pairs = [(t - sampler.t0, ms) for t, ms in _pairs(ctx, shape.tag)]
    out: dict[str, Any] = {
        "system": shape.system,
        "key": name,
        "live_table": shape.live_table,
        "worker": system.worker_label,
        "capacity": capacity,
        "offered": offered,
        "sent": n_each * PRODUCERS,
        "enqueue_batch": plan.enqueue_batch,
        "load": offered / capacity,
        "seconds": plan.seconds,
        # The epoch second every series' time counts from (to set them against the server log).
        "t0": sampler.t0,
        "produced_until": produced_until,
        "snapshot_at": snapshot_at,
        "commit_at": commit_at,
        "export": bool(plan.export_dir) and name == "pgq",
        "export_runs": export.runs if export is not None else 0,
        "export_cpu": plan.export_cpu,
        "export_every": plan.export_every,
        "export_max_ranges": plan.export_max_ranges,
        "backlog": sampler.backlog,
        "samples": sampler.samples,
        "processed": [t for t, _ in pairs],
        "latency": [[t, ms] for t, ms in pairs],
        "statements": statements,
    }
    if snapshot_at is not None:
        out["explain"] = {"calm": explain_calm, "during": explain_during}
    out["figures"] = figures(out)
    return out


def _backlog(conn: psycopg.Connection[Any], shape: Shape) -> int:
    return int(scalar(conn, shape.backlog_sql))


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.time()
    if delay > 0:
        time.sleep(delay)


# The claim's candidate search as pgq's claim walks it (its partial index, its order, no
# bitmap scan, as the claim's own plan settings), read without locking anything: what a
# claim has to step over is what this reads. "bounded" starts the same walk one second back
# instead of at the index head, as a claim that remembered where the last one ended would.
PGQ_CANDIDATES = """
EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT)
SELECT id FROM pgqueue_message
WHERE queue = %s AND attempts < max_attempts AND available_at <= now() {bound}
ORDER BY queue, priority DESC, available_at, id LIMIT 100
"""
BOUND = "AND available_at >= now() - interval '1 second'"


def explain_claim(conn: psycopg.Connection[Any], system: System) -> dict[str, str]:
    if not isinstance(system, Ours):
        return {}
    out = {}
    for label, bound in (("head", ""), ("bounded", BOUND)):
        with conn.transaction():
            conn.execute("SET LOCAL enable_bitmapscan = off")
            conn.execute("SET LOCAL enable_seqscan = off")
            rows = conn.execute(PGQ_CANDIDATES.format(bound=bound), [QUEUE]).fetchall()
        out[label] = "\n".join(r[0] for r in rows)
    return out


# The export's CPU priority, as a command prefix: how much of what the load feels is Spark's
# CPU. Under autogroup a nice counts only within its session's group, and every PostgreSQL
# backend leads a session of its own: "background" starts the export in a session of its own
# whose group is at nice 19 (plain nice 19 where the kernel has no autogroup).
_OWN_LOW_GROUP = '{ echo 19 > /proc/self/autogroup; } 2>/dev/null; exec nice -n 19 "$@"'
EXPORT_CPU = {
    "background": ["setsid", "sh", "-c", _OWN_LOW_GROUP, "sh"],
    "idle": ["chrt", "--idle", "0"],
    "low": ["nice", "-n", "19"],
    "normal": [],
}


@dataclass(frozen=True)
class ExportHow:
    """How the bench runs ``pgq_pipeline export``."""

    cpu: str = "normal"  # CPU priority, a key of EXPORT_CPU
    every: float = 0.0  # one --every process with passes this far apart; 0: a process per pass
    max_ranges: int = 0  # --max-ranges of each pass; 0: all


class Exporter:
    """``pgq_pipeline export`` (Spark, local[1]) while it runs, as ``how`` says: one ``--every``
    process whose passes share one Spark session, or one process per pass started back to
    back."""

    LOG = "pgq-pipeline-export"

    def __init__(self, ctx: Context, destination: Path, how: ExportHow) -> None:
        self.ctx = ctx
        self.destination = destination
        self.how = how
        self._stop = threading.Event()
        self.runs = 0  # passes that exported rows, read from the log once stopped
        self.failed = 0
        self._log = ctx.out_dir / "logs" / f"{self.LOG}.log"
        self._log_start = self._log.stat().st_size if self._log.exists() else 0
        self._proc: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @classmethod
    def spawn(cls, ctx: Context, destination: Path, how: ExportHow) -> subprocess.Popen[str]:
        repeat = ["--every", f"{how.every:g}"] if how.every else []
        bounded = ["--max-ranges", str(how.max_ranges)] if how.max_ranges else []
        command = [*EXPORT_CPU[how.cpu], ctx.python, "-m", "django", "pgq_pipeline"]
        command += ["--master", "local[1]", "export", str(destination), *repeat, *bounded]
        return ctx.spawn(command, cls.LOG, pipe_stdout=False)

    @classmethod
    def check(cls, ctx: Context, destination: Path, how: ExportHow) -> None:
        """One export before the run: a missing JDBC driver or Java fails here, not after
        the load has run for minutes."""
        if cls.spawn(ctx, destination, how).wait() != 0:
            raise RuntimeError(
                "pgq_pipeline export failed before the run: see "
                f"logs/{cls.LOG}.log in the results folder"
            )

    def _run(self) -> None:
        while not self._stop.is_set():
            self._proc = self.spawn(self.ctx, self.destination, self.how)
            # A run cut short by stop() is not a failure; any other non-zero exit is.
            if self._proc.wait() != 0 and not self._stop.is_set():
                self.failed += 1

    def pids(self) -> list[int]:
        """The running pass's processes: the command, its JVM and Spark's Python workers."""
        proc = self._proc
        return process_tree(proc.pid) if proc is not None and proc.poll() is None else []

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            # SIGTERM: a --every process ends after its running pass; a single pass stops.
            self._proc.terminate()
            try:
                self._proc.wait(120)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._thread.join(60)
        with open(self._log, errors="replace") as log:
            log.seek(self._log_start)
            lines = log.read().splitlines()
        self.runs = sum(1 for line in lines if re.match(r"export #\d+: ", line))
        # A --every pass that failed and was retried says so in the log.
        self.failed += sum(1 for line in lines if line.startswith("export: pass failed"))


# --- figures -----------------------------------------------------------------------------


def _between(values: list[tuple[float, Any]], a: float, b: float) -> list[Any]:
    return [v for t, v in values if a <= t < b]


def _rate(times: list[float], a: float, b: float) -> float:
    return sum(1 for t in times if a <= t < b) / (b - a) if b > a else float("nan")


def _per_message(run: dict[str, Any], a: float, b: float, counter: str = "claim_buffers") -> float:
    """The increase of ``counter`` (buffers, CPU seconds) over [a, b) per message processed
    in it, from the samples."""
    samples = [s for s in run["samples"] if a <= s["t"] <= b and counter in s]
    if len(samples) < 2:
        return float("nan")
    first, last = samples[0], samples[-1]
    done = _rate(run["processed"], first["t"], last["t"]) * (last["t"] - first["t"])
    if not done:
        return float("nan")
    return float(last[counter] - first[counter]) / done


def _busy_share(run: dict[str, Any], a: float, b: float) -> float:
    """How busy the machine's cores were over [a, b), from the samples: 1.0 = all of them."""
    samples = [s for s in run["samples"] if a <= s["t"] <= b and "machine_busy" in s]
    if len(samples) < 2:
        return float("nan")
    first, last = samples[0], samples[-1]
    cores = os.cpu_count() or 1
    return (last["machine_busy"] - first["machine_busy"]) / (last["t"] - first["t"]) / cores


def _index_bytes(sample: dict[str, Any], table: str) -> int:
    return int(sample["tables"].get(table, {}).get("index_bytes", 0))


def figures(run: dict[str, Any]) -> dict[str, float]:
    """The issue's ratios for one system's run (NaN where they do not apply)."""
    seconds = run["seconds"]
    times = run["processed"]
    latency = [(t, ms) for t, ms in run["latency"]]
    warm = min(10.0, seconds * 0.05)
    out: dict[str, float] = {"capacity": run["capacity"], "offered": run["offered"]}
    quarter = seconds / 4
    first = (warm, warm + quarter)
    last = (seconds - quarter, seconds)
    out["rate_first"] = _rate(times, *first)
    out["rate_last"] = _rate(times, *last)
    out["last_over_first"] = out["rate_last"] / out["rate_first"]
    samples = run["samples"]
    if samples:
        live = SHAPES[run["key"]].live_table
        # At the end of each quarter: flat once the table has filled, or growing.
        for q in (1, 2, 3, 4):
            upto = [s for s in samples if s["t"] <= q * quarter] or samples[:1]
            out[f"index_mib_q{q}"] = _index_bytes(upto[-1], live) / 2**20
        out["dead_max"] = max(sum(t["dead"] for t in s["tables"].values()) for s in samples)
    out["backlog_max"] = max((b for _, b in run["backlog"]), default=0)
    out["p50_ms"] = percentile([ms for _, ms in latency], 50)
    out["p99_ms"] = percentile([ms for _, ms in latency], 99)
    if run["snapshot_at"] is None:
        out["buffers_per_msg_first"] = _per_message(run, *first)
        out["buffers_per_msg_last"] = _per_message(run, *last)
        out["all_buffers_per_msg_first"] = _per_message(run, *first, "system_buffers")
        out["all_buffers_per_msg_last"] = _per_message(run, *last, "system_buffers")
        return out
    begin, end = run["snapshot_at"], run["commit_at"]
    before = (warm, begin)
    out["rate_before"] = _rate(times, *before)
    out["rate_during"] = _rate(times, begin, end)
    out["during_over_before"] = out["rate_during"] / out["rate_before"]
    out["backlog_max_during"] = max(_between(run["backlog"], begin, end), default=0)
    out["backlog_max_over_10s_load"] = out["backlog_max_during"] / (10 * run["offered"])
    p99_before = percentile(_between(latency, *before), 99)
    p99_during = percentile(_between(latency, begin, end), 99)
    out["p99_before_ms"] = p99_before
    out["p99_during_ms"] = p99_during
    out["p99_ratio"] = p99_during / p99_before
    # The last third of the window: the worst, when the most dead entries have piled up.
    late = (end - (end - begin) / 3, end + 1)
    calm = _per_message(run, *before)
    during = _per_message(run, *late)
    out["buffers_per_msg_calm"] = calm
    out["buffers_per_msg_during"] = during
    out["buffers_ratio"] = during / calm
    out["all_buffers_per_msg_calm"] = _per_message(run, *before, "system_buffers")
    out["all_buffers_per_msg_during"] = _per_message(run, *late, "system_buffers")
    for counter in ("server_cpu", "worker_cpu"):
        out[f"{counter}_ms_per_msg_calm"] = 1000 * _per_message(run, *before, counter)
        out[f"{counter}_ms_per_msg_during"] = 1000 * _per_message(run, *late, counter)
    out["machine_busy_calm"] = _busy_share(run, *before)
    out["machine_busy_during"] = _busy_share(run, *late)
    out["recovery_s"] = recovery_seconds(run, before, end)
    return out


def recovery_seconds(run: dict[str, Any], calm: tuple[float, float], commit: float) -> float:
    """Seconds from COMMIT until the backlog is back to calm (twice its calm median, or one
    second of offered load if that is more); NaN if it never is."""
    calm_backlog = _between(run["backlog"], *calm)
    limit = max(2 * statistics.median(calm_backlog) if calm_backlog else 0, run["offered"])
    for t, backlog in run["backlog"]:
        if t >= commit and backlog <= limit:
            return t - commit
    return float("nan")
