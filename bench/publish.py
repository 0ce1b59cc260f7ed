"""Write docs/benchmarks.md and docs/img/bench-*.png from one results folder.

    python -m bench publish bench/results/<run> [--summary bench/summary.md] [--commit ID]
                            [--docs-dir docs]

The page is regenerated from the run's own files (results.jsonl, facts.json, plots), so the
numbers in the docs are always the ones a run printed. ``--summary`` is the hand-written
"What the numbers say" section; its ``{placeholders}`` are filled with the run's figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .context import REPO_DIR

PAGE = """# Benchmarks

django-pgqueue measured side by side with raw PostgreSQL doing the same work (psycopg, no
framework) and with its peers — Procrastinate, PgQueuer, django-tasks-db and Celery on Redis
— on one PostgreSQL, in one run: ~{payload}-byte JSON payloads, no-op handlers.

**Read the ratios.** Every ratio is taken between cases measured in alternating slices
*within one repetition* (the order rotates every slice), then summarised as the median and
min\u2013max over the repetitions, so that a machine that slows down or speeds up during the
run moves both sides alike. Absolute rates depend on the machine and its load (here: load
average {load}).

## Summary

{summary_table}

`\u00d7` is the ratio of the first case to the second, each pair measured alongside.

{notes}
## Reproduce

```bash
{command}
```

This page is that run: mode `{mode}`, {reps} repetitions, {minutes} minutes, ended
{date}, django-pgqueue at commit `{commit}`. `bash bench/run.sh` alone is the full run (larger
backlogs, a 60-second steady state, a 1,000,000-message memory run; about 25 minutes on an
idle 2-core machine); `--quick` about 10; `--only enqueue,drain --reps 1 --no-peers` a few.

`bench/run.sh` creates the peers' virtualenvs under `bench/.venvs/` (git-ignored) from PyPI
on first use, then runs `python -m bench` against `BENCH_SERVER_DSN` (default
`postgresql://postgres@127.0.0.1:5432/postgres`) in a database of its own (`--db`, default
`pgq_bench`, created and dropped). Options: `--reps N` (default 3), `--only` (scenarios:
enqueue, drain, claim, producers, latency, steady, memory), `--peers` / `--no-peers`,
`--keep-db`, `--out`. Celery needs Redis on 127.0.0.1:6379 (`BENCH_REDIS_URL`). Results land
in `bench/results/<timestamp>-<mode>/` (`results.jsonl`, `report.md`, `facts.json`, plots,
logs); `python -m bench publish <that folder> --summary bench/summary.md` writes this page.

## The machine

- {nproc} CPU cores ({cpu}), {memory} GiB RAM, Linux {kernel}; the clients, the workers and
  PostgreSQL share those cores.
- PostgreSQL {pg_version} on 127.0.0.1: {pg_settings}.
- Python {python}, Django {django}, psycopg {psycopg}. Peers: {peers}.
- Redis (Celery's broker) on 127.0.0.1:6379.

## Every case of the run

Rates are messages/s. `n` = messages per repetition; `\u00d7 ref` = ratio to the raw
reference measured alongside (for enqueue: single-row INSERT + NOTIFY + commit, the same work
as `enqueue()`, or INSERT + commit without NOTIFY, or COPY for bulk paths;
for processing: the raw two-statement lease-then-archive with batches of 100, 1 connection,
synchronous commit); `tx/msg` = committed transactions in the bench database per message
(`pg_stat_database.xact_commit` delta, harness transactions subtracted); `WAL B/msg` =
`pg_current_wal_lsn()` delta per message. The WAL position is cluster-wide and other
databases on the server write too, so the minimum over the repetitions is shown.

{details}
{failures}
### Plots

![Processing rates](img/bench-drain.png)

![Enqueue rates](img/bench-enqueue.png)

![Idle latency](img/bench-latency.png)

![Steady state](img/bench-steady.png)

![Worker RSS over a long run](img/bench-rss.png)

## What is measured

| scenario | how |
|---|---|
| enqueue | Single-row paths ({enqueue_n} messages each, in 10 alternating slices): `enqueue()` in autocommit, with and without NOTIFY; `enqueue_on_commit()` inside `atomic()` as a view would; the `django.tasks` backend's `task.enqueue()`; against a raw psycopg `INSERT` + `pg_notify` + commit per row into a minimal one-index table (the same work as `enqueue()`; `enqueue()` without NOTIFY against a plain `INSERT` + commit), and against `enqueue()`'s own statement sent raw, prepared, into django-pgqueue's table (its table's constraints and indexes, without its Python). Bulk: `enqueue_many()` in calls of 1,000 rows (plain queue, a dedup key each, fair queue, both) against raw `COPY` of the same rows 1,000 per transaction, {bulk_n} rows each in 5 slices. Peers: their single and batch APIs, each slice alternating with the raw reference. |
| drain | Each consumer's backlog is loaded first ({drain_n} messages; {drain_mid_n} for raw batch 10, {drain_slow_n} for batch 1), then drained in 10 alternating slices per consumer: raw `DELETE ... SKIP LOCKED RETURNING` at batch 1/10/100; raw lease-then-archive (lease: CTE `SELECT ... FOR UPDATE SKIP LOCKED` + `UPDATE ... RETURNING`; archive: `WITH moved AS (DELETE ... RETURNING) INSERT INTO archive`), with synchronous and asynchronous commit; `Message.objects.lease()` + `core.transitions.complete()` in batches of 100. |
| `pgq_worker` | A real `manage.py pgq_worker` process (persistent connections), idle and listening; a slice of {slice_n} messages lands in one transaction with its NOTIFY and is timed on the database clock, from just before that COMMIT (`clock_timestamp()`) to the last acknowledgement (`max(finished_at)` in the archive); 5 slices per setting. Slices alternate with raw lease-then-archive slices. Several `--concurrency` / `--batch-size` settings, and one with `SYNCHRONOUS_ACKS = True`. |
| peers' workers | {drain_n} messages for PgQueuer at batch 100, {peer_slow_n} for the others (they run a few hundred jobs/s here), in 5 slices. Each peer's own worker (PgQueuer `QueueManager` in drain mode; Procrastinate `run_worker_async(wait=False)`; django-tasks-db's `db_worker` loop in batch mode, in-process; Celery prefork worker, consumer switched on once the backlog is in Redis), timed inside the adapter, alternating with raw lease-then-archive slices. |
| claim vs backlog | `lease()` + `complete()` in batches of 100 with 1,000 ready messages (drained completely, reloaded, repeated) and with {claim_big} ready messages (first {claim_measured} claimed). The tables are `ANALYZE`d after loading. |
| producers | {producers} producer processes, each a persistent connection doing single-row writes flat out: raw INSERT, raw INSERT + `pg_notify`, `enqueue()` with NOTIFY off and on; alternating rounds. |
| latency | An idle `pgq_worker` and an idle raw LISTEN/NOTIFY + `DELETE ... SKIP LOCKED` loop side by side; the producer alternates between them, 50 messages/s each ({latency_n} each); the handler reports `time.time()` at its start minus the time stamped just before the enqueue call (same host clock), over UDP. Peers: the same with their own idle worker. |
| steady state | 2 producer processes at a fixed total rate and one `pgq_worker --concurrency 4` together for {steady}s; lag = age of the oldest ready message, sampled every 0.25 s; end-to-end latency as above. |
| memory | Peak RSS (`VmHWM`) of each worker process in the drain runs; one worker through {rss_n} messages (topped up 20,000 at a time), RSS sampled every 0.5 s; slope fitted after the first 10%. |

The server runs with `autovacuum = off` during the run, and every case starts from truncated
tables. The harness itself is checked by `tests/bench/` (a tiny run: `--mode smoke`).

## Retention

Expiring one day of 1,000,000 archived rows (about 200 bytes each) through
`core._retention.run_retention()`: as a whole-day partition drop, and as batched deletes of the
same rows (what a per-queue retention shorter than another queue's takes); each once quiet and
once while one process drains a queue (`lease()` + `complete()`, batches of 100). Same
2-core machine, shared with other workloads during this run:

| how | seconds | WAL bytes | other sessions' WAL bytes/s | archive n_dead_tup after | seconds while draining | drain msg/s during | drain msg/s just before |
|---|---:|---:|---:|---:|---:|---:|---:|
| partition drop | 1.003 | 6,168,496 | 8,011,776 | 0 | 2.572 | 2,527 | 3,150 |
| batched DELETE | 54.945 | 716,880,824 | 13,144,064 | 1,000,000 | 86.518 | 646 | 1,650 |

The WAL column is the whole server's (`pg_current_wal_lsn()` difference); the next one says
how fast other sessions were writing just before. See [Retention](how-to/retention.md).

## Metrics scrape cost

What one scrape of the queue gauges (`django_pgqueue.metrics.views.metrics`) costs the
database, against exact `COUNT(*)` gauges of the same states. One queue holds 997,000 live
messages (70% ready, 20% scheduled, 10% leased) and 1,000,000 dead ones, three small queues
1,000 live each; 500,000 archived rows. Measured before the first vacuum (no visibility map:
index-only scans visit the heap, the worst case) and after `VACUUM ANALYZE` (what autovacuum
keeps a table at). Server time from `EXPLAIN (ANALYZE, BUFFERS, TIMING OFF)`, best of 5;
round trip = the plain statement timed by the client. The 2-core machine was shared with
other jobs during the run, so the milliseconds are noisy; the buffers are not.

| statement | phase | execution ms | buffers | round trip ms |
|---|---|---:|---:|---:|
| scrape: queue list | before vacuum | 0.3 | 39 | 1.9 |
| scrape: gauges | before vacuum | 276.7 | 11,708 | 232.9 |
| scrape: workers, estimates | before vacuum | 0.2 | 14 | 2.8 |
| exact COUNT(*): live | before vacuum | 1055.8 | 13,742 | 1004.6 |
| exact COUNT(*): dead | before vacuum | 1297.1 | 15,385 | 1039.1 |
| scrape: queue list | after VACUUM ANALYZE | 0.3 | 37 | 4.8 |
| scrape: gauges | after VACUUM ANALYZE | 55.0 | 340 | 74.6 |
| scrape: workers, estimates | after VACUUM ANALYZE | 0.2 | 14 | 1.3 |
| exact COUNT(*): live | after VACUUM ANALYZE | 1009.3 | 13,742 | 887.1 |
| exact COUNT(*): dead | after VACUUM ANALYZE | 342.6 | 792 | 299.2 |

One scrape: 238 ms before vacuum, 81 ms after (round trips of its three statements), against
2,044 ms and 1,186 ms for exact counts: 9x and 15x. The gauges' cost is bounded by the cap,
not the table: per queue at most 10,001 index entries for each of ready, scheduled and dead,
1,001 heap rows to tell leased from scheduled, and one index probe per priority for the
oldest ready message; so it stays the same at ten million rows, while the exact counts grow
with the tables. A queue far below the cap costs a few buffers.

## Other benchmarks

Each is a subcommand of `python -m bench` (`--help` gives its options) and creates and drops
its own database:

- Fairness and limits, `python -m bench flow`: summarised in
  [What it costs](how-to/fairness-and-limits.md#what-it-costs), its latest run in
  `bench/notes/flow-control.md`.
- The Spark pipeline, `python -m bench pipeline`: in
  [Performance](how-to/pipeline.md#performance) and `bench/notes/pipeline.md`.
- Throughput under MVCC pressure, `python -m bench mvcc`: a private cluster with the server's
  defaults (autovacuum on); a sustained load, a `REPEATABLE READ` snapshot held,
  `pgq_pipeline export` alongside (`--export-cpu`, `--export-every`, `--export-max-ranges`,
  `--export-under`), a 10,000,000-message backlog, 1 to 16 workers (`--minutes`, `--long`,
  `--only`, `--rate`, `--backlog`, `--tenants`, `--workers`); PgQueuer and Procrastinate side
  by side in all but the export. Its latest runs are in `bench/notes/mvcc.md`, explained in
  [Under MVCC pressure](explanation/mvcc-pressure.md). In the backlog and many-workers
  scenarios each peer runs its own worker: PgQueuer's `QueueManager` in drain mode (batch 100
  on the backlog, 10 as many workers), Procrastinate's worker with `wait=False` (concurrency
  4; a tenth of the jobs timed on the backlog, at least 1,000, and a twentieth of the
  messages as many workers). A peer's big backlog is one job enqueued through its API and
  copied server-side; a timed run on it stops after the jobs asked for (a batch more at most,
  counted). The run's folder keeps the cluster's log; the export's report ends with the run
  minute by minute (throughput, enqueue \u2192 start p50 and p99, the backlog, the machine's busy
  and iowait shares, the cores each side used, the disks' writes, what the cluster's
  backends were doing); `--report <folder>` recomputes a finished run's tables and plots.
- The admin dashboard at 1,000,000 rows: `tests/admin/test_scale.py`, in
  [Why it stays fast](how-to/operate-with-the-admin.md#why-it-stays-fast).
- The enqueue paths alone, `python -m bench --mode quick --only enqueue,drain --no-peers`:
  single and bulk enqueue against their raw references, and what orjson (the `fast` extra)
  changes in a drain; the latest run in `bench/notes/enqueue.md`.

## Design measurements

Questions a design choice rested on, each measured once on the 2-core machine:

| question | finding |
|---|---|
| What a queue-name `CHECK` costs | Per row of a 2,000-row `UPDATE` (PostgreSQL 15): 0.5\u20130.8 \u00b5s for `queue ~ '^[a-z0-9][a-z0-9_-]*$'`, 1.4\u20131.8 \u00b5s for the `ltrim` + `left` spelling, 4.2 \u00b5s for the regular expression with its length bound (`{{0,47}}`). A single-row `INSERT` prepares the table's CHECKs again for each statement: the `ltrim` spelling adds 23 \u00b5s of server time to it, the unbounded regular expression 11 \u00b5s (`EXPLAIN ANALYZE`, medians of 300). The live table and `pgqueue_queue` carry the unbounded expression; the archive and dead tables have none. |
| A fair `enqueue()` planned on an empty table, then 100,000 rows | With a plan fixed on the empty table a single enqueue took 40 ms; the statement that probes the tenant's newest place takes under 1 ms planned either way. |
| The acknowledgement's shape | `id = ANY(ids)` over the batch's arrays completes 1.12\u20131.17\u00d7 as many messages per second as a join with `unnest()` of the batch, whether planned on a backlog or on a few rows. |
| The walk from a fair order's head behind 2,000,000 ready | Before vacuum, a walk from the head grew from 415 to 8,568 buffers over 200,000 claims, while the walk from the claimer's bounds stayed at 214\u2013293 per claim of 100. |
| Latency stalls against checkpoints and autovacuum | Stalls (messages started over 300 ms after their enqueue) overlapped a checkpoint, an autovacuum or an autoanalyze no more often than those windows' share of the run: they come from a nearly saturated machine, not from either. |
| `nice -n 19` against a session of its own at nice 19 | Against two busy backends on two cores, a CPU-bound loop got 34% of the CPU under plain `nice -n 19` (37% under `SCHED_IDLE`) and 1.6% started in a session whose autogroup is at nice 19. |
| What the live table costs an enqueue | Server CPU per row on PostgreSQL 15 (the backend's own run time, medians of 5\u20137): a single-row `INSERT` in its own statement costs 34 \xb5s into `pgqueue_message` against 10 \xb5s into the raw reference's one-index table. Without its four `CHECK`s 23\u201325 \xb5s (one `CHECK` of all four conditions costs as much as four: PostgreSQL prepares their expressions again for each statement, by size), with the queue-name `CHECK` alone 29 \xb5s; with the primary key alone (and the `CHECK`s) 21 \xb5s, with one index and no `CHECK` 16 \xb5s. In `COPY`, per row: 5.5 \xb5s into the one-index table; into a copy of the live table 8.0 plain, 9.0 with dedup keys (the unique index), 11.0 in a fair queue (its two order indexes), 11.5 both, against 8.5, 10.5, 11.5 and 13.5 for `enqueue_many()` (the fair order's places, the key check); the probe for held dedup keys 0.8, paid only once a `COPY` met one. Against the ~0.7 ms of a single enqueue's commit the `CHECK`s are ~1%: they stay, the only guard on rows written by other means than `enqueue()`. |
"""


def _summary(values: list[float], unit: str = "\u00d7", digits: int = 2) -> str:
    if not values:
        return "not measured"
    med = statistics.median(values)
    return f"{med:.{digits}f}{unit} ({min(values):.{digits}f}\u2013{max(values):.{digits}f})"


def notes_values(results: list[dict[str, Any]]) -> dict[str, str]:
    """The figures the hand-written notes quote, taken from the run itself."""
    from .report import TARGETS, paired_ratio

    reps = sorted({r["rep"] for r in results})
    by_name = {t.name: t for t in TARGETS}

    def target(prefix: str, unit: str = "\u00d7", digits: int = 2) -> str:
        t = next(t for name, t in by_name.items() if name.startswith(prefix))
        return _summary(
            [v for rep in reps if (v := t.per_rep(results, rep)) is not None], unit, digits
        )

    def ratio(key: str) -> str:
        return _summary(
            [x for r in results if r["key"] == key if (x := paired_ratio(results, r)) is not None]
        )

    def extra(key: str, name: str, unit: str = " ms", digits: int = 1) -> str:
        return _summary(
            [r["extra"][name] for r in results if r["key"] == key and name in r["extra"]],
            unit,
            digits,
        )

    def summarised(t: Any) -> str:
        return _summary([v for rep in reps if (v := t.per_rep(results, rep)) is not None])

    def bulk_values() -> dict[str, str]:
        # Each bulk target is followed by its same-schema twin (report._bulk_targets); the
        # twins share one name, so they are found by position.
        names = [t.name for t in TARGETS]
        values = {}
        for key, what in (
            ("enqueue_many", "`enqueue_many()` / raw COPY"),
            ("enqueue_many_keyed", "`enqueue_many()`, a dedup key each / raw COPY"),
            ("enqueue_many_fair", "`enqueue_many()`, fair queue / raw COPY"),
            (
                "enqueue_many_fair_keyed",
                "`enqueue_many()`, fair queue, a dedup key each / raw COPY",
            ),
        ):
            index = names.index(what)
            values[key] = summarised(TARGETS[index])
            values[f"{key}_live"] = summarised(TARGETS[index + 1])
        return values

    rss = next((r for r in results if r["key"] == "pgq.worker.rss_long"), None)
    steady = [r for r in results if r["key"] == "pgq.steady"]
    values = {
        "worker_best": target("`pgq_worker` (best setting) / raw"),
        "worker_sync": target("\u21b3 the same with `SYNCHRONOUS_ACKS = True` (like for like)"),
        "vs_peer": target("`pgq_worker` (best setting) / best peer"),
        "lease_complete": target("lease + complete"),
        "enqueue": target("single `enqueue()`"),
        "enqueue_own": target("\u21b3 the same / `enqueue()`'s own statement"),
        **bulk_values(),
        "notify": target("8 producers"),
        "raw_notify": ratio("raw.producers_notify"),
        "lat_p50": target("idle latency enqueue \u2192 handler start, p50", " ms", 1),
        "lat_p99": target("idle latency enqueue \u2192 handler start, p99", " ms", 1),
        "raw_p50": extra("raw.latency", "p50_ms"),
        "raw_p99": extra("raw.latency", "p99_ms"),
        "claim": target("claim rate"),
        "rss": (
            f"{rss['extra']['rss_warm_mib']:.1f} \u2192 {rss['extra']['rss_end_mib']:.1f} MiB, "
            f"{rss['extra']['slope_kib_per_100k']:.0f} KiB per 100,000 messages"
            if rss
            else "not measured"
        ),
        "steady": (
            f"{statistics.median(r['extra']['offered_rate'] for r in steady):,.0f} messages/s "
            f"offered and {statistics.median(r['rate'] for r in steady):,.0f}/s processed; "
            f"lag p99 {statistics.median(r['extra']['lag_p99_ms'] for r in steady):.1f} ms, "
            f"end-to-end p99 {statistics.median(r['extra']['p99_ms'] for r in steady):.1f} ms"
            if steady
            else "not measured"
        ),
    }
    return values


def _load(facts: dict[str, Any]) -> str:
    """The load average (1, 5, 15 minutes) when the run started, and when it ended if known."""
    start = ", ".join(f"{x:.1f}" for x in facts["loadavg_start"])
    if "loadavg_end" not in facts:
        return f"{start} when the run started"
    end = ", ".join(f"{x:.1f}" for x in facts["loadavg_end"])
    return f"{start} when the run started, {end} when it ended"


def run_command(facts: dict[str, Any], reps: int) -> str:
    """The command that repeats the run: its mode, repetitions, scenarios and peers."""
    words = ["bash bench/run.sh"]
    if facts["mode"] != "full":
        words.append("--quick" if facts["mode"] == "quick" else f"--mode {facts['mode']}")
    if reps != 3:
        words.append(f"--reps {reps}")
    if facts.get("only"):
        words.append(f"--only {facts['only']}")
    peers = facts.get("peers")
    if peers == []:
        words.append("--no-peers")
    elif peers and sorted(peers) != sorted(["pgqueuer", "procrastinate", "tasksdb", "celery"]):
        words.append(f"--peers {','.join(peers)}")
    return " ".join(words)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench publish")
    parser.add_argument("folder")
    parser.add_argument("--summary", default="", help="the hand-written notes (a template)")
    parser.add_argument("--commit", default="", help="the commit measured, if facts lack it")
    parser.add_argument("--docs-dir", default=str(REPO_DIR / "docs"), help="where to write")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    facts = json.loads((folder / "facts.json").read_text())
    from .report import detail_tables, summary_table

    results = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines() if x]
    reps_done = len({r["rep"] for r in results if r["scenario"] == "drain"})
    notes = Path(args.summary).read_text() if args.summary else ""
    if notes:
        notes = notes.format(**notes_values(results))
    pg = facts["postgres"]
    pg_settings = ", ".join(f"{k}={v}" for k, v in sorted(pg.items()) if k != "server_version")
    failures = ""
    if facts.get("failures"):
        failures = (
            "Cases that failed in this run (not in the tables):\n\n"
            + "\n".join(f"- {f}" for f in facts["failures"])
            + "\n"
        )
    from .config import MODES

    sizes = MODES[facts["mode"]]
    page = PAGE.format(
        payload=facts["payload_bytes"],
        load=_load(facts),
        summary_table=summary_table(results),
        notes=notes,
        command=run_command(facts, reps_done),
        mode=facts["mode"],
        reps=reps_done,
        minutes=round(facts["seconds"] / 60),
        date=datetime.fromtimestamp((folder / "results.jsonl").stat().st_mtime, UTC).strftime(
            "%Y-%m-%d %H:%M UTC"
        ),
        commit=args.commit or facts.get("commit", "unknown"),
        details=detail_tables(results),
        failures=failures,
        nproc=facts["nproc"],
        cpu=facts["cpu"] or "unknown CPU",
        memory=facts["memory_gib"],
        kernel=facts["kernel"],
        pg_version=pg.get("server_version", "?"),
        pg_settings=pg_settings,
        python=facts["python"],
        django=facts["django"],
        psycopg=facts["psycopg"],
        peers=", ".join(f"{k} {v}" for k, v in facts.get("peer_versions", {}).items()) or "none",
        claim_big=f"{sizes.claim_big:,}",
        claim_measured=f"{sizes.claim_measured:,}",
        producers=sizes.producers,
        steady=f"{sizes.steady_seconds:g} ",
        rss_n=f"{sizes.rss_n:,}",
        enqueue_n=f"{sizes.enqueue_n:,}",
        bulk_n=f"{sizes.bulk_n:,}",
        drain_n=f"{sizes.drain_n:,}",
        drain_mid_n=f"{sizes.drain_mid_n:,}",
        drain_slow_n=f"{sizes.drain_slow_n:,}",
        slice_n=f"{sizes.drain_n // 5:,}",
        peer_slow_n=f"{sizes.peer_slow_n:,}",
        latency_n=f"{sizes.latency_n:,}",
    )
    docs = Path(args.docs_dir)
    (docs / "img").mkdir(parents=True, exist_ok=True)
    for png in sorted(folder.glob("bench-*.png")):
        shutil.copy(png, docs / "img" / png.name)
    (docs / "benchmarks.md").write_text(page)
    print(f"wrote {docs / 'benchmarks.md'}")
    return 0
