"""Scenarios that run in the harness process or in producer processes: raw references,
django-pgqueue's enqueue paths and its lease + complete loop, backlog independence and
NOTIFY under 8 producers. The worker scenarios are in workers.py, the peers in peers/."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import core_cases, raw
from .config import QUEUE, TASK, payload
from .context import Context
from .measure import CaseRun, Result, interleaved, result_from_run, timed

RAW = "raw psycopg"
PGQ = "django-pgqueue"
ROUNDS = 10  # slices per case in interleaved measurements


def _conns(conn: Any) -> list[Any]:
    """The harness's connections whose statistics a measurement flushes: ``conn`` and
    Django's."""
    from django.db import connection

    return [conn, connection] if conn is not None else [connection]


def _reset_all(conn: Any) -> None:
    raw.reset(conn)
    core_cases.reset()


@dataclass(frozen=True)
class Case:
    key: str
    system: str
    variant: str
    ref: str | None  # key of the reference it is compared with
    run: Callable[[int], int]  # one slice (its round): messages handled
    backlog: int | None = None  # the backlog it drained


def _measure(
    ctx: Context, rep: int, scenario: str, conns: list[Any], rounds: int, cases: list[Case]
) -> None:
    """The cases in ``rounds`` interleaved slices (``measure.interleaved``), a result each."""
    runs = interleaved(ctx.probe, conns, rounds, [(c.key, c.run) for c in cases])
    for c in cases:
        extra = {} if c.backlog is None else {"backlog": c.backlog}
        ctx.recorder.add(
            result_from_run(
                runs[c.key],
                key=c.key,
                scenario=scenario,
                system=c.system,
                variant=c.variant,
                rep=rep,
                ref=c.ref,
                **extra,
            )
        )


def _slices(n: int, fn: Callable[..., int], *args: Any) -> Callable[[int], int]:
    """A slice of ``n`` messages of ``fn(*args, n, start)``, each round its own messages."""
    return lambda r: fn(*args, n, r * n)


# --- enqueue -----------------------------------------------------------------------------

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


def enqueue(ctx: Context, rep: int) -> None:
    n = max(1, ctx.sizes.enqueue_n // ROUNDS)
    notify = "raw.insert1_notify"
    with raw.connect(ctx.dsn) as conn:
        _reset_all(conn)
        core_cases.warm_up()
        # fmt: off
        cases = [
            Case("raw.insert1", RAW, "single-row INSERT + commit", None,
                 _slices(n, raw.insert_one_by_one, conn)),
            Case(notify, RAW, "single-row INSERT + NOTIFY + commit", None,
                 _slices(n, raw.insert_notify_one_by_one, conn)),
            Case("raw.enqueue_statement", RAW, "enqueue()'s own INSERT + NOTIFY, prepared, into "
                 "django-pgqueue's table + commit", None,
                 _slices(n, raw.enqueue_statement_one_by_one, conn)),
            Case("raw.enqueue_statement_on_commit", RAW, "the same, each sent from an on_commit "
                 "hook of Django's atomic()", None,
                 lambda r: raw.enqueue_statement_one_by_one(conn, n, r * n, on_commit=True)),
            Case("pgq.enqueue", PGQ, "enqueue(), autocommit, NOTIFY on (default)", notify,
                 _slices(n, core_cases.enqueue_single)),
            Case("pgq.enqueue_nonotify", PGQ, "enqueue(), autocommit, NOTIFY off", "raw.insert1",
                 _slices(n, core_cases.enqueue_single_without_notify)),
            Case("pgq.enqueue_on_commit", PGQ, "enqueue_on_commit() in atomic(), 1 per transaction",
                 notify, _slices(n, core_cases.enqueue_on_commit_in_atomic)),
        ]
        if tasks_available():
            cases.append(Case("pgq.tasks_enqueue", PGQ, "django.tasks backend: task.enqueue(), "
                              "autocommit", notify, _slices(n, tasks_enqueue)))
        # fmt: on
        _measure(ctx, rep, "enqueue", _conns(conn), ROUNDS, cases)
        _reset_all(conn)
        raw.empty_live_copy(conn)
        # The same rows per transaction on every side: BULK_CHUNK per COPY and per call.
        n = max(BULK_CHUNK, ctx.sizes.bulk_n // 5)
        chunk = f"{BULK_CHUNK:,}"
        cases = [
            Case("raw.copy", RAW, f"COPY, {chunk} rows per transaction", None,
                 _slices(n, _copy_in_chunks, conn)),
        ]  # fmt: skip
        for suffix, (what, case) in BULK_CASES.items():
            # fmt: off
            cases += [
                Case(f"raw.copy_live{suffix}", RAW, f"COPY into a copy of django-pgqueue's table, "
                     f"{chunk} per transaction, of enqueue_many()'s rows{what}", "raw.copy",
                     _slices(n, _live_copy, conn, case)),
                Case(f"pgq.enqueue_many{suffix}", PGQ, f"enqueue_many(), {chunk} per call{what}",
                     "raw.copy", lambda r, case=case: core_cases.enqueue_many(
                         n, r * n, BULK_CHUNK, **case)),
            ]
            # fmt: on
        _measure(ctx, rep, "enqueue", _conns(conn), 5, cases)
        _reset_all(conn)
        raw.empty_live_copy(conn)


def _copy_in_chunks(conn: Any, n: int, start: int) -> int:
    for offset in range(start, start + n, BULK_CHUNK):
        raw.copy_rows(conn, min(BULK_CHUNK, start + n - offset), offset)
    return n


def _live_copy(conn: Any, case: dict[str, Any], n: int, start: int) -> int:
    """``n`` rows COPY'd into the live table's copy, ``BULK_CHUNK`` a transaction: the rows
    ``enqueue_many(**case)`` writes."""
    fair = case.get("queue") == FAIR_QUEUE
    for offset in range(start, start + n, BULK_CHUNK):
        size = min(BULK_CHUNK, start + n - offset)
        raw.copy_live_rows(conn, size, offset, fair=fair, **case)
    return n


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
        _reset_all(conn)
        raw.copy_rows(conn, slow * ROUNDS, queue="d1")
        raw.copy_rows(conn, mid * ROUNDS, queue="d10")
        for q in ("d100", "la", "la_async"):
            raw.copy_rows(conn, fast * ROUNDS, queue=q)
        core_cases.enqueue_many(fast * ROUNDS, queue="pgq")
        core_cases.enqueue_many(fast * ROUNDS, queue="pgq_sync")
        conn.execute("VACUUM ANALYZE raw_q")
        conn.execute("VACUUM ANALYZE pgqueue_message")
        core_cases.warm_up()
        ref = "raw.lease_archive.b100"
        delete = "DELETE ... SKIP LOCKED RETURNING, batch {}, 1 conn"
        lease = "Message.objects.lease() + complete(), batch 100 (default: async acks)"
        # fmt: off
        cases = [
            Case("raw.delete.b1", RAW, delete.format(1), ref,
                 lambda r: raw.delete_drain(conn, 1, slow, "d1"), slow * ROUNDS),
            Case("raw.delete.b10", RAW, delete.format(10), ref,
                 lambda r: raw.delete_drain(conn, 10, mid, "d10"), mid * ROUNDS),
            Case("raw.delete.b100", RAW, delete.format(100), ref,
                 lambda r: raw.delete_drain(conn, 100, fast, "d100"), fast * ROUNDS),
            Case(ref, RAW, "lease UPDATE ... RETURNING, then DELETE -> archive INSERT; batch 100",
                 None, lambda r: raw.lease_archive_drain(conn, 100, fast, "la"), fast * ROUNDS),
            Case(f"{ref}.async", RAW, "the same with synchronous_commit = off", ref,
                 lambda r: raw.lease_archive_drain(async_conn, 100, fast, "la_async"),
                 fast * ROUNDS),
            Case("pgq.lease_complete.b100", PGQ, lease, ref,
                 lambda r: core_cases.lease_complete_drain(100, fast, "pgq"), fast * ROUNDS),
            Case("pgq.lease_complete.b100.sync", PGQ, "the same with SYNCHRONOUS_ACKS = True", ref,
                 lambda r: core_cases.lease_complete_drain(100, fast, "pgq_sync", True),
                 fast * ROUNDS),
        ]
        # fmt: on
        _measure(ctx, rep, "drain", [conn, async_conn, *_conns(None)], ROUNDS, cases)
        _reset_all(conn)
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
    core_cases.execute("VACUUM ANALYZE pgqueue_message")

    def with_standard_json(r: int) -> int:
        with core_cases.standard_json():
            return core_cases.lease_complete_drain(100, fast, "pgq_json")

    def with_orjson(r: int) -> int:
        return core_cases.lease_complete_drain(100, fast, "pgq_orjson")

    orjson = "pgq.lease_complete.b100.orjson"
    # fmt: off
    cases = [
        Case(orjson, PGQ, "lease() + complete(), batch 100, payloads decoded by orjson (the "
             "`fast` extra)", None, with_orjson),
        Case("pgq.lease_complete.b100.json", PGQ, "the same, decoded by the standard library's "
             "json", orjson, with_standard_json),
    ]
    # fmt: on
    _measure(ctx, rep, "drain", _conns(None), ROUNDS, cases)
    core_cases.reset()


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
            _reset_all(conn)
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

        _reset_all(conn)
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
        _reset_all(conn)
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
        _reset_all(conn)
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
        _reset_all(conn)
