"""``manage.py pgq_worker`` as users run it: a real worker process, idle and listening, then
a backlog lands in one transaction and the harness times it until the live table is empty.
Also latency at a trickle, a steady state with producers, and memory over a long run."""

from __future__ import annotations

import importlib.util
import json
import statistics
import threading
import time
from typing import Any

import psycopg

from . import core_cases, raw
from .config import LATENCY_TASK, QUEUE, TASK, payload
from .context import Context
from .measure import (
    CaseRun,
    Result,
    latency_summary,
    percentile,
    result_from_run,
    timed,
    wait_until,
)
from .peers.protocol import trickle_sync
from .pg import Snapshot, rss_kib, scalar
from .scenarios import PGQ, Producers, _conns

# How often the watcher checks that a slice is drained. The drain's end is read from the
# database clock (last_ack_at), so this only bounds how soon the next slice starts; each
# check scans the head of a table full of dead rows, on the worker's CPUs: not too often.
POLL_SECONDS = 0.1


def available() -> bool:
    return importlib.util.find_spec("django_pgqueue.management.commands.pgq_worker") is not None


class Worker:
    """One ``pgq_worker`` process on the bench queue."""

    def __init__(self, ctx: Context, concurrency: int, batch: int, label: str, **env: str) -> None:
        self.ctx = ctx
        args = [ctx.python, "-m", "django", "pgq_worker", "--queue", QUEUE, "--worker-id", label]
        args += ["--concurrency", str(concurrency), "--batch-size", str(batch)]
        self.proc = ctx.spawn(args, label, pipe_stdout=False, **env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, watch: psycopg.Connection[Any]) -> None:
        """Ready = it has processed one message (so it is connected and listening)."""
        core_cases.enqueue_single(1, start=10**9)
        if not wait_until(lambda: _live(watch) == 0, 60, 0.05):
            self.stop()
            raise RuntimeError(f"pgq_worker did not start (see {self.ctx.out_dir}/logs)")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except Exception:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def _live(conn: psycopg.Connection[Any]) -> int:
    return int(scalar(conn, "SELECT count(*) FROM pgqueue_message"))


def _drained(conn: psycopg.Connection[Any]) -> bool:
    return bool(scalar(conn, "SELECT NOT EXISTS (SELECT 1 FROM pgqueue_message)"))


COPY_MESSAGES = "COPY pgqueue_message (queue, task, payload) FROM STDIN"


def load_and_release(conn: psycopg.Connection[Any], n: int, start: int) -> float:
    """Write ``n`` ready messages and their wake-up in one transaction; returns the database
    clock (epoch seconds) read just before COMMIT (nothing is visible to a worker before it)."""
    from django_pgqueue.conf import get_settings

    with conn.cursor() as cur:
        with cur.copy(COPY_MESSAGES) as copy:
            for i in range(start, start + n):
                copy.write_row((QUEUE, TASK, json.dumps(payload(i))))
        cur.execute("SELECT pg_notify(%s, %s)", [get_settings().NOTIFY_CHANNEL, QUEUE])
        now = scalar(cur, "SELECT extract(epoch FROM clock_timestamp())::float8")
    conn.commit()
    return float(now)


def last_ack_at(conn: psycopg.Connection[Any]) -> float:
    """When the newest archived message was acknowledged (database clock, epoch seconds):
    the end of a drain, without the watcher's polling interval."""
    return float(
        scalar(conn, "SELECT extract(epoch FROM max(finished_at))::float8 FROM pgqueue_archive")
    )


def wait_drained(watch: psycopg.Connection[Any], timeout: float = 600) -> tuple[float, int]:
    polls = 0
    deadline = time.monotonic() + timeout
    while not _drained(watch):
        polls += 1
        if time.monotonic() > deadline:
            raise TimeoutError("the worker did not drain the backlog in time")
        time.sleep(POLL_SECONDS)
    return time.perf_counter(), polls + 1


def drain(ctx: Context, rep: int) -> None:
    """Each worker setting is paired with the raw lease-then-archive reference in alternating
    slices: raw drains a slice of its backlog, then a slice lands on the idle worker and is
    timed from its commit until the live table is empty. The last slice also takes the
    server cost; the worker is stopped before the counters are read."""
    s = ctx.sizes
    rounds = 5
    chunk = max(1, s.drain_n // rounds)
    settings = [(c, b, False) for c, b in s.worker_settings]
    settings.append((*s.worker_settings[-1], True))
    for concurrency, batch, sync_acks in settings:
        suffix = ".sync" if sync_acks else ""
        label = f"pgq-worker-c{concurrency}-b{batch}{suffix}"
        with (
            raw.connect(ctx.dsn) as watch,
            raw.connect(ctx.dsn) as ref_conn,
            psycopg.connect(ctx.dsn) as loader,
        ):
            core_cases.reset()
            raw.reset(watch)
            raw.copy_rows(watch, chunk * rounds, queue="wla")
            worker = Worker(
                ctx, concurrency, batch, label, BENCH_SYNC_ACKS="1" if sync_acks else "0"
            )
            raw_run = CaseRun()
            seconds = 0.0
            box = None
            try:
                worker.wait_ready(watch)
                core_cases.reset()
                for r in range(rounds):
                    t0 = time.perf_counter()
                    raw_run.n += raw.lease_archive_drain(ref_conn, 100, chunk, "wla")
                    raw_run.seconds += time.perf_counter() - t0
                    # Timed on the database clock, from the load's commit to the last ack.
                    if r < rounds - 1:
                        t0 = load_and_release(loader, chunk, r * chunk)
                        wait_drained(watch)
                        seconds += last_ack_at(watch) - t0
                        continue
                    with timed(ctx.probe, [watch, ref_conn, loader]) as box:
                        t0 = load_and_release(loader, chunk, r * chunk)
                        wal_loaded = ctx.probe.wal_now()
                        _, polls = wait_drained(watch)
                    t1 = last_ack_at(watch)
                    seconds += t1 - t0
                    assert box.start is not None
                    # Count the drain only: not the loading transaction nor the polls.
                    box.start = Snapshot(box.start.xact_commit, wal_loaded)
                    box.extra_tx += polls + 1
                    box.wal_end = ctx.probe.wal_now()
                peak = rss_kib(worker.pid, "VmHWM")
            finally:
                worker.stop()
            archived = scalar(watch, "SELECT count(*) FROM pgqueue_archive")
        assert box is not None
        box.seconds = t1 - t0
        tx_per_msg, wal_per_msg = box.per_message(chunk)
        raw_rate = raw_run.n / raw_run.seconds
        n = chunk * rounds
        ctx.recorder.add(
            Result(
                key=f"pgq.worker.c{concurrency}.b{batch}{suffix}",
                scenario="drain",
                system=PGQ,
                variant=f"pgq_worker --concurrency {concurrency} --batch-size {batch}"
                + (", SYNCHRONOUS_ACKS = True" if sync_acks else ""),
                rep=rep,
                ref="raw.lease_archive.b100",
                n=n,
                seconds=seconds,
                rate=n / seconds,
                tx_per_msg=tx_per_msg,
                wal_per_msg=wal_per_msg,
                extra={
                    "paired_ref_rate": raw_rate,
                    "peak_rss_mib": round(peak / 1024, 1),
                    "ok": archived == n,
                },
            )
        )


def latency(ctx: Context, rep: int) -> None:
    """Idle pgq_worker and the raw LISTEN/NOTIFY reference side by side: the trickle
    alternates between them, so both see the same machine at the same moments."""
    s = ctx.sizes
    from psycopg.types.json import Jsonb

    from django_pgqueue import enqueue

    ready = ctx.out_dir / "raw-listener.ready"
    ready.unlink(missing_ok=True)
    with raw.connect(ctx.dsn) as watch:
        core_cases.reset()
        raw.reset(watch)
        worker = Worker(ctx, 4, 100, "pgq-worker-latency")
        listener = ctx.spawn(
            [ctx.python, "-m", "bench.raw", ctx.dsn, str(ctx.udp.port), str(ready)],
            "raw-listener",
            pipe_stdout=False,
        )
        try:
            worker.wait_ready(watch)
            if not wait_until(ready.exists, 30):
                raise RuntimeError("raw listener did not start")
            time.sleep(0.5)
            ctx.udp.reset()

            def send(body: dict[str, Any]) -> None:
                if body["ref"][-1] in "02468":
                    watch.execute(raw.INSERT_NOTIFY, [QUEUE, Jsonb(body), QUEUE])
                else:
                    enqueue(LATENCY_TASK, body, queue=QUEUE)

            # Each system gets latency_rate messages per second.
            trickle_sync(2 * s.latency_n, 2 * s.latency_rate, send)
            ok = wait_until(lambda: len(ctx.udp.samples) >= 2 * s.latency_n, 30)
        finally:
            worker.stop()
            listener.terminate()
            listener.wait(10)
    for tag, key, system, variant in (
        ("raw", "raw.latency", "raw psycopg", "LISTEN/NOTIFY + DELETE ... SKIP LOCKED, idle"),
        ("pgq", "pgq.latency", PGQ, "pgq_worker --concurrency 4, idle, LISTEN/NOTIFY"),
    ):
        summary = latency_summary(ctx.udp.tagged.get(tag, []))
        ctx.recorder.add(
            Result(
                key=key,
                scenario="latency",
                system=system,
                variant=variant,
                rep=rep,
                n=s.latency_n,
                extra={**summary, "ok": ok},
            )
        )
    core_cases.reset()


LAG_SQL = """
SELECT count(*) FILTER (WHERE available_at <= now()),
       COALESCE(EXTRACT(EPOCH FROM now() - min(available_at) FILTER (WHERE available_at <= now())), 0)
FROM pgqueue_message
"""


def steady(ctx: Context, rep: int) -> None:
    """Producers at a fixed rate and one worker together; lag = age of the oldest ready
    message, sampled every 0.25 s; end-to-end latency from the handlers' reports."""
    s = ctx.sizes
    producers = 2
    n_each = int(s.steady_rate / producers * s.steady_seconds)
    samples: list[tuple[float, int, float]] = []
    with raw.connect(ctx.dsn) as watch:
        core_cases.reset()
        worker = Worker(ctx, 4, 100, "pgq-worker-steady")
        group = None
        try:
            worker.wait_ready(watch)
            group = Producers(ctx, producers)
            ctx.udp.reset()
            stop = threading.Event()

            def sample() -> None:
                with raw.connect(ctx.dsn) as conn:
                    t0 = time.time()
                    while not stop.is_set():
                        row = conn.execute(LAG_SQL).fetchone()
                        assert row is not None
                        samples.append((time.time() - t0, int(row[0]), float(row[1]) * 1000))
                        time.sleep(0.25)

            sampler = threading.Thread(target=sample, daemon=True)
            with timed(ctx.probe, _conns(watch)) as box:
                sampler.start()
                reports = group.run("pgq", n_each, 0, s.steady_rate / producers, latency=True)
                wait_until(lambda: _drained(watch), 60, 0.05)
                stop.set()
                sampler.join()
            rss = rss_kib(worker.pid)
            group.close()
            group = None
        finally:
            if group is not None:
                group.close()
            worker.stop()
    n = sum(r["n"] for r in reports)
    produce_seconds = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    box.seconds = produce_seconds
    box.extra_tx += len(samples)
    lags = [lag for _, _, lag in samples] or [0.0]
    summary = latency_summary(ctx.udp.tagged.get("pgq", []))
    ctx.recorder.add(
        result_from_run(
            CaseRun.timed(box, n),
            key="pgq.steady",
            scenario="steady",
            system=PGQ,
            variant=f"{producers} producers \u00d7 enqueue() at {s.steady_rate:,.0f}/s in total for "
            f"{s.steady_seconds:g} s; pgq_worker --concurrency 4 --batch-size 100",
            rep=rep,
            offered_rate=n / produce_seconds,
            lag_p50_ms=statistics.median(lags),
            lag_p99_ms=percentile(lags, 99),
            lag_max_ms=max(lags),
            rss_mib=round(rss / 1024, 1),
            ready_max=max((r for _, r, _ in samples), default=0),
            series=[list(x) for x in samples],
            **summary,
        )
    )
    core_cases.reset()


def memory_long(ctx: Context, rep: int) -> None:
    """One worker through ``rss_n`` messages, topped up in chunks so the backlog stays
    bounded; RSS sampled every 0.5 s against messages processed."""
    s = ctx.sizes
    chunk = min(20_000, s.rss_n)
    series: list[tuple[int, int]] = []
    with raw.connect(ctx.dsn) as watch, psycopg.connect(ctx.dsn) as loader:
        core_cases.reset()
        worker = Worker(ctx, 4, 100, "pgq-worker-long")
        t0 = time.perf_counter()
        try:
            worker.wait_ready(watch)
            core_cases.reset()
            loaded = 0
            while True:
                live = _live(watch)
                done = loaded - live
                series.append((done, rss_kib(worker.pid)))
                if loaded < s.rss_n and live < chunk:
                    size = min(chunk, s.rss_n - loaded)
                    load_and_release(loader, size, loaded)
                    loaded += size
                elif loaded >= s.rss_n and live == 0:
                    break
                time.sleep(0.5)
            peak = rss_kib(worker.pid, "VmHWM")
        finally:
            worker.stop()
    seconds = time.perf_counter() - t0
    warm = [x for x in series if x[0] >= s.rss_n * 0.1]
    xs = [d for d, _ in warm]
    ys = [r for _, r in warm]
    slope = _slope(xs, ys) * 100_000 if len(warm) >= 3 else float("nan")
    ctx.recorder.add(
        Result(
            key="pgq.worker.rss_long",
            scenario="memory",
            system=PGQ,
            variant=f"pgq_worker --concurrency 4 --batch-size 100, {s.rss_n:,} messages",
            rep=rep,
            n=s.rss_n,
            seconds=seconds,
            rate=s.rss_n / seconds,
            extra={
                "rss_warm_mib": ys[0] / 1024 if ys else float("nan"),
                "rss_end_mib": ys[-1] / 1024 if ys else float("nan"),
                "growth_mib": (max(ys) - ys[0]) / 1024 if ys else float("nan"),
                "peak_rss_mib": peak / 1024,
                "slope_kib_per_100k": slope,
                "series": [list(x) for x in series],
            },
        )
    )
    core_cases.reset()


def _slope(xs: list[int], ys: list[int]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
