"""Scenarios that run in the harness process or in producer processes: raw references,
django-pgqueue's enqueue paths and its lease + complete loop, backlog independence and
NOTIFY under 8 producers. The worker scenarios are in workers.py, the peers in peers/."""

from __future__ import annotations

import json
import time
from typing import Any

from . import core_cases, raw
from .config import QUEUE, TASK, payload
from .context import Context
from .measure import (
    CaseRun,
    Result,
    interleaved,
    result_from_run,
    timed,
)

RAW = "raw psycopg"
PGQ = "django-pgqueue"


def _conns(conn: Any) -> list[Any]:
    """The harness's connections whose statistics a measurement flushes."""
    from django.db import connection

    return [conn, connection]


def _reset_all(ctx: Context, conn: Any) -> None:
    raw.reset(conn)
    core_cases.reset()


def _record_runs(
    ctx: Context,
    rep: int,
    scenario: str,
    runs: dict[str, CaseRun],
    labels: dict[str, tuple[str, str, str | None]],
    backlogs: dict[str, int] | None = None,
) -> None:
    """A result for each case of an interleaved measurement; ``labels[key]`` is its
    (system, variant, reference key), ``backlogs[key]`` the backlog it drained."""
    for key, run in runs.items():
        system, variant, ref = labels[key]
        extra = {"backlog": backlogs[key]} if backlogs else {}
        ctx.recorder.add(
            result_from_run(
                run,
                key=key,
                scenario=scenario,
                system=system,
                variant=variant,
                rep=rep,
                ref=ref,
                **extra,
            )
        )


# --- enqueue -----------------------------------------------------------------------------

ROUNDS = 10  # slices per case in interleaved measurements


def enqueue(ctx: Context, rep: int) -> None:
    s = ctx.sizes
    single = max(1, s.enqueue_n // ROUNDS)
    bulk_n = s.bulk_n
    with raw.connect(ctx.dsn) as conn:
        _reset_all(ctx, conn)
        core_cases.warm_up()
        cases: list[tuple[str, Any]] = [
            ("raw.insert1", lambda r: raw.insert_one_by_one(conn, single, r * single)),
            (
                "raw.insert1_notify",
                lambda r: raw.insert_notify_one_by_one(conn, single, r * single),
            ),
            (
                "raw.enqueue_statement",
                lambda r: raw.enqueue_statement_one_by_one(conn, single, r * single),
            ),
            ("pgq.enqueue", lambda r: core_cases.enqueue_single(single, r * single)),
            (
                "pgq.enqueue_nonotify",
                lambda r: core_cases.enqueue_single_without_notify(single, r * single),
            ),
            (
                "pgq.enqueue_on_commit",
                lambda r: core_cases.enqueue_on_commit_in_atomic(single, r * single),
            ),
        ]
        if tasks_available():
            cases.append(("pgq.tasks_enqueue", lambda r: tasks_enqueue(single, r * single)))
        runs = interleaved(ctx.probe, _conns(conn), ROUNDS, cases)
        labels = {
            "raw.insert1": (RAW, "single-row INSERT + commit", None),
            "raw.insert1_notify": (RAW, "single-row INSERT + NOTIFY + commit", None),
            "raw.enqueue_statement": (
                RAW,
                "enqueue()'s own INSERT + NOTIFY, prepared, into django-pgqueue's table + commit",
                None,
            ),
            "pgq.enqueue": (
                PGQ,
                "enqueue(), autocommit, NOTIFY on (default)",
                "raw.insert1_notify",
            ),
            "pgq.enqueue_nonotify": (PGQ, "enqueue(), autocommit, NOTIFY off", "raw.insert1"),
            "pgq.enqueue_on_commit": (
                PGQ,
                "enqueue_on_commit() in atomic(), 1 per transaction",
                "raw.insert1_notify",
            ),
            "pgq.tasks_enqueue": (
                PGQ,
                "django.tasks backend: task.enqueue(), autocommit",
                "raw.insert1_notify",
            ),
        }
        _record_runs(ctx, rep, "enqueue", runs, labels)
        _reset_all(ctx, conn)
        raw.empty_live_copy(conn)
        # The same rows per transaction on every side: BULK_CHUNK per COPY and per call.
        per_round = max(BULK_CHUNK, bulk_n // 5)
        rounds: list[tuple[str, Any]] = [
            ("raw.copy", lambda r: _copy_in_chunks(conn, per_round, r * per_round))
        ]
        for suffix, (_, case) in BULK_CASES.items():
            rounds.append((f"raw.copy_live{suffix}", _live_copy_round(conn, per_round, case)))
            rounds.append(
                (
                    f"pgq.enqueue_many{suffix}",
                    lambda r, case=case: core_cases.enqueue_many(
                        per_round, r * per_round, BULK_CHUNK, **case
                    ),
                )
            )
        runs = interleaved(ctx.probe, _conns(conn), 5, rounds)
        bulk_labels = {"raw.copy": (RAW, f"COPY, {BULK_CHUNK:,} rows per transaction", None)}
        for suffix, (what, _) in BULK_CASES.items():
            bulk_labels[f"raw.copy_live{suffix}"] = (
                RAW,
                f"COPY into a copy of django-pgqueue's table, {BULK_CHUNK:,} per transaction, "
                f"of enqueue_many()'s rows{what}",
                "raw.copy",
            )
            bulk_labels[f"pgq.enqueue_many{suffix}"] = (
                PGQ,
                f"enqueue_many(), {BULK_CHUNK:,} per call{what}",
                "raw.copy",
            )
        _record_runs(ctx, rep, "enqueue", runs, bulk_labels)
        _reset_all(ctx, conn)
        raw.empty_live_copy(conn)


BULK_CHUNK = 1_000  # rows per COPY transaction and per enqueue_many() call
FAIR_QUEUE = "bench_fair"  # FAIRNESS on in bench/settings.py
# The bulk cases by key suffix: how they differ from the plain one, enqueue_many()'s arguments.
BULK_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "": ("", {}),
    ".dedup": (", a dedup key each", {"dedup": True}),
    ".fair": (", fair queue", {"queue": FAIR_QUEUE, "tenant": "bulk"}),
    ".fair_dedup": (
        ", fair queue, a dedup key each",
        {"queue": FAIR_QUEUE, "tenant": "bulk", "dedup": True},
    ),
}


def _copy_in_chunks(conn: Any, n: int, start: int) -> int:
    for offset in range(start, start + n, BULK_CHUNK):
        raw.copy_rows(conn, min(BULK_CHUNK, start + n - offset), offset)
    return n


def _live_copy_round(conn: Any, n: int, case: dict[str, Any]) -> Any:
    """A slice of ``n`` rows COPY'd into the live table's copy, ``BULK_CHUNK`` a transaction:
    the rows ``enqueue_many(**case)`` writes."""
    fair = case.get("queue") == FAIR_QUEUE

    def run(r: int) -> int:
        start = r * n
        for offset in range(start, start + n, BULK_CHUNK):
            size = min(BULK_CHUNK, start + n - offset)
            raw.copy_live_rows(conn, size, offset, fair=fair, **case)
        return n

    return run


def tasks_available() -> bool:
    from django.conf import settings

    return bool(getattr(settings, "TASKS", None))


def tasks_enqueue(n: int, start: int = 0) -> int:
    from bench.benchapp.tasks import noop_task

    for i in range(start, start + n):
        noop_task.enqueue(payload(i))
    return n


# --- drain (in-process consumers) ---------------------------------------------------------


def drain(ctx: Context, rep: int) -> None:
    """Every consumer gets its own backlog (its own queue), loaded up front; then they drain
    it in interleaved slices."""
    s = ctx.sizes
    slow = max(1, s.drain_slow_n // ROUNDS)
    mid = max(1, s.drain_mid_n // ROUNDS)
    fast = max(1, s.drain_n // ROUNDS)
    with raw.connect(ctx.dsn) as conn, raw.connect(ctx.dsn) as async_conn:
        async_conn.execute("SET synchronous_commit = off")
        _reset_all(ctx, conn)
        raw.copy_rows(conn, slow * ROUNDS, queue="d1")
        raw.copy_rows(conn, mid * ROUNDS, queue="d10")
        for q in ("d100", "la", "la_async"):
            raw.copy_rows(conn, fast * ROUNDS, queue=q)
        core_cases.enqueue_many(fast * ROUNDS, queue="pgq")
        core_cases.enqueue_many(fast * ROUNDS, queue="pgq_sync")
        conn.execute("VACUUM ANALYZE raw_q")
        conn.execute("VACUUM ANALYZE pgqueue_message")
        core_cases.warm_up()
        cases: list[tuple[str, Any]] = [
            ("raw.delete.b1", lambda r: raw.delete_drain(conn, 1, slow, "d1")),
            ("raw.delete.b10", lambda r: raw.delete_drain(conn, 10, mid, "d10")),
            ("raw.delete.b100", lambda r: raw.delete_drain(conn, 100, fast, "d100")),
            ("raw.lease_archive.b100", lambda r: raw.lease_archive_drain(conn, 100, fast, "la")),
            (
                "raw.lease_archive.b100.async",
                lambda r: raw.lease_archive_drain(async_conn, 100, fast, "la_async"),
            ),
            (
                "pgq.lease_complete.b100",
                lambda r: core_cases.lease_complete_drain(100, fast, "pgq"),
            ),
            (
                "pgq.lease_complete.b100.sync",
                lambda r: core_cases.lease_complete_drain(100, fast, "pgq_sync", True),
            ),
        ]
        runs = interleaved(ctx.probe, [conn, async_conn, _django()], ROUNDS, cases)
        ref = "raw.lease_archive.b100"
        labels = {
            "raw.delete.b1": (RAW, "DELETE ... SKIP LOCKED RETURNING, batch 1, 1 conn", ref),
            "raw.delete.b10": (RAW, "DELETE ... SKIP LOCKED RETURNING, batch 10, 1 conn", ref),
            "raw.delete.b100": (RAW, "DELETE ... SKIP LOCKED RETURNING, batch 100, 1 conn", ref),
            "raw.lease_archive.b100": (
                RAW,
                "lease UPDATE ... RETURNING, then DELETE -> archive INSERT; batch 100",
                None,
            ),
            "raw.lease_archive.b100.async": (RAW, "the same with synchronous_commit = off", ref),
            "pgq.lease_complete.b100": (
                PGQ,
                "Message.objects.lease() + complete(), batch 100 (default: async acks)",
                ref,
            ),
            "pgq.lease_complete.b100.sync": (PGQ, "the same with SYNCHRONOUS_ACKS = True", ref),
        }
        backlogs = {key: fast * ROUNDS for key in labels}
        backlogs.update({"raw.delete.b1": slow * ROUNDS, "raw.delete.b10": mid * ROUNDS})
        _record_runs(ctx, rep, "drain", runs, labels, backlogs)
        _reset_all(ctx, conn)
        _json_drains(ctx, rep, fast)


def _json_drains(ctx: Context, rep: int, fast: int) -> None:
    """The same drain decoding payloads with orjson and with the standard library's json
    (``core/_json.py``), on two backlogs of their own; only when orjson is installed."""
    with core_cases.standard_json() as swapped:
        pass
    if not swapped:
        return
    core_cases.enqueue_many(fast * ROUNDS, queue="pgq_orjson")
    core_cases.enqueue_many(fast * ROUNDS, queue="pgq_json")
    _vacuum_analyze_live()

    def with_standard_json(r: int) -> int:
        with core_cases.standard_json():
            return core_cases.lease_complete_drain(100, fast, "pgq_json")

    runs = interleaved(
        ctx.probe,
        [_django()],
        ROUNDS,
        [
            (
                "pgq.lease_complete.b100.orjson",
                lambda r: core_cases.lease_complete_drain(100, fast, "pgq_orjson"),
            ),
            ("pgq.lease_complete.b100.json", with_standard_json),
        ],
    )
    labels = {
        "pgq.lease_complete.b100.orjson": (
            "lease() + complete(), batch 100, payloads decoded by orjson (the `fast` extra)",
            None,
        ),
        "pgq.lease_complete.b100.json": (
            "the same, decoded by the standard library's json",
            "pgq.lease_complete.b100.orjson",
        ),
    }
    for key, run in runs.items():
        variant, ref = labels[key]
        ctx.recorder.add(
            result_from_run(
                run, key=key, scenario="drain", system=PGQ, variant=variant, rep=rep, ref=ref
            )
        )
    core_cases.reset()


def _vacuum_analyze_live() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE pgqueue_message")


def _django() -> Any:
    from django.db import connection

    return connection


# --- claim rate vs backlog -----------------------------------------------------------------


COPY_MESSAGES = "COPY pgqueue_message (queue, task, payload) FROM STDIN"


def _load_messages(conn: Any, n: int) -> None:
    """Ready messages straight into the live table (the fastest way to a big backlog)."""
    body = json.dumps(payload(0))
    with conn.transaction(), conn.cursor() as cur, cur.copy(COPY_MESSAGES) as copy:
        for _ in range(n):
            copy.write_row((QUEUE, TASK, body))
    conn.execute("ANALYZE pgqueue_message")


def claim(ctx: Context, rep: int) -> None:
    s = ctx.sizes
    add = ctx.recorder.add
    with raw.connect(ctx.dsn) as conn:
        # Small backlog: load claim_small, drain it all, repeat until claim_measured are done.
        rounds = max(1, s.claim_measured // s.claim_small)
        seconds = 0.0
        tx = wal = done = 0
        for _ in range(rounds):
            _reset_all(ctx, conn)
            _load_messages(conn, s.claim_small)
            core_cases.warm_up()
            with timed(ctx.probe, _conns(conn)) as box:
                done += core_cases.lease_complete_drain(100)
            box.finish()
            seconds += box.seconds
            tx += box.transactions()
            wal += box.wal_bytes()
        add(
            Result(
                key="pgq.claim.small",
                scenario="claim",
                system=PGQ,
                variant=f"lease + complete, batch 100, {s.claim_small:,} ready",
                rep=rep,
                n=done,
                seconds=seconds,
                rate=done / seconds,
                tx_per_msg=tx / done,
                wal_per_msg=wal / done,
            )
        )

        _reset_all(ctx, conn)
        t0 = time.perf_counter()
        _load_messages(conn, s.claim_big)
        load_s = time.perf_counter() - t0
        core_cases.warm_up()
        with timed(ctx.probe, _conns(conn)) as box:
            done = core_cases.lease_complete_drain(100, limit=s.claim_measured)
        add(
            result_from_run(
                CaseRun.timed(box, done),
                key="pgq.claim.big",
                scenario="claim",
                system=PGQ,
                variant=f"lease + complete, batch 100, {s.claim_big:,} ready",
                rep=rep,
                load_seconds=round(load_s, 1),
            )
        )
        _reset_all(ctx, conn)
        conn.execute("VACUUM ANALYZE pgqueue_message")


# --- 8 producers, NOTIFY on and off --------------------------------------------------------


class Producers:
    """``count`` producer processes, connected once and reused for every round."""

    def __init__(self, ctx: Context, count: int) -> None:
        self.procs = [
            ctx.spawn([ctx.python, "-m", "bench.producer", ctx.dsn], f"producer-{k}")
            for k in range(count)
        ]
        for p in self.procs:
            line = p.stdout.readline().strip()
            if line != "ready":
                self.close()
                raise RuntimeError(f"producer failed to start (see logs/producer-*.log): {line!r}")

    def run(
        self,
        system: str,
        n_each: int,
        start: int = 0,
        rate: float = 0.0,
        latency: bool = False,
        batch: int = 1,
    ) -> list[dict[str, Any]]:
        """All producers at once; returns their reports."""
        for k, p in enumerate(self.procs):
            command = f"run {system} {n_each} {start + k * n_each} {rate}"
            command += " latency" if latency else " -"
            p.stdin.write(f"{command} {batch}\n")
            p.stdin.flush()
        return [json.loads(p.stdout.readline()) for p in self.procs]

    def flush(self) -> int:
        """Make every producer publish its statistics; returns the transactions that took."""
        for p in self.procs:
            p.stdin.write("flush\n")
            p.stdin.flush()
        for p in self.procs:
            p.stdout.readline()
        return 2 * len(self.procs)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.stdin.write("exit\n")
                    p.stdin.flush()
                    p.wait(30)
                except Exception:
                    p.kill()


def _span(reports: list[dict[str, Any]]) -> float:
    return max(r["end"] for r in reports) - min(r["start"] for r in reports)


def producers(ctx: Context, rep: int) -> None:
    """Concurrent single-row producers, the four variants in alternating rounds."""
    s = ctx.sizes
    rounds = 5
    n_each = max(1, s.producer_n // rounds)
    cases = [
        ("raw", "raw.producers", RAW, "INSERT + commit", None),
        ("raw-notify", "raw.producers_notify", RAW, "INSERT + pg_notify + commit", "raw.producers"),
        ("pgq-nonotify", "pgq.producers_nonotify", PGQ, "enqueue(), NOTIFY off", "raw.producers"),
        ("pgq", "pgq.producers_notify", PGQ, "enqueue(), NOTIFY on (default)", "raw.producers"),
    ]
    totals = {key: [0, 0.0] for _, key, *_ in cases}
    costs: dict[str, Any] = {}
    with raw.connect(ctx.dsn) as conn:
        _reset_all(ctx, conn)
        group = Producers(ctx, s.producers)
        try:
            for r in range(rounds):
                shift = r % len(cases)
                for system, key, *_ in cases[shift:] + cases[:shift]:
                    start = r * s.producers * n_each
                    if r == rounds - 1:
                        group.flush()  # earlier rounds' counters must not land in this one
                        with timed(ctx.probe, _conns(conn)) as box:
                            reports = group.run(system, n_each, start)
                        box.extra_tx += group.flush()
                        box.finish()
                        costs[key] = box
                    else:
                        reports = group.run(system, n_each, start)
                    totals[key][0] += sum(x["n"] for x in reports)
                    totals[key][1] += _span(reports)
        finally:
            group.close()
        for _system, key, name, variant, ref in cases:
            n, seconds = totals[key]
            box = costs[key]
            cost_n = s.producers * n_each
            ctx.recorder.add(
                Result(
                    key=key,
                    scenario="producers",
                    system=name,
                    variant=f"{s.producers} producers: {variant}",
                    rep=rep,
                    ref=ref,
                    n=int(n),
                    seconds=seconds,
                    rate=n / seconds,
                    tx_per_msg=box.transactions() / cost_n,
                    wal_per_msg=box.wal_bytes() / cost_n,
                )
            )
        _reset_all(ctx, conn)
