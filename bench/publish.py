"""Write docs/benchmarks.md and docs/img/bench-*.png from one results folder.

    python -m bench.publish bench/results/<run> [--notes notes.md]

The page is regenerated from the run's own files (report.md, facts.json, plots), so the
numbers in the docs are always the ones a run printed. ``--notes`` adds a hand-written
"What the numbers say" section.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from .context import REPO_DIR

PAGE = """# Benchmarks

How django-pgqueue compares with raw PostgreSQL doing the same work, and with its peers
(Procrastinate, PgQueuer, django-tasks-db, Celery on Redis), measured side by side on one
PostgreSQL in one run. ~{payload}-byte JSON payloads, no-op handlers.

**Read the ratios, not the absolute rates.** The machine below is small and was shared with
other work while the run took place (load average {load}), so absolute rates swing by 2-5x
from one minute to the next. Every ratio is therefore computed between cases measured in
alternating slices *within one repetition* (the harness rotates the order every slice), and
then summarised as the median and min\u2013max over {reps} repetitions.

{notes}
## Results

Run: mode `{mode}`, {reps} repetitions, {minutes} minutes, {date}.

{report}
Columns: `n` = messages per repetition; `\u00d7 ref` = ratio to the raw reference measured
alongside (for enqueue: single-row INSERT+commit, or COPY for bulk paths; for processing:
the raw two-statement lease-then-archive with batches of 100, 1 connection, synchronous
commit); `tx/msg` = committed transactions in the bench database per message
(`pg_stat_database.xact_commit` delta, harness transactions subtracted; autovacuum's count
too); `WAL B/msg` = `pg_current_wal_lsn()` delta per message. The WAL position is
cluster-wide and other databases on the server write too, so the minimum over the
repetitions is shown and small cases can still be inflated.

{failures}
### Plots

![Processing rates](img/bench-drain.png)

![Enqueue rates](img/bench-enqueue.png)

![Idle latency](img/bench-latency.png)

![Steady state](img/bench-steady.png)

![Worker RSS over a long run](img/bench-rss.png)

## The machine

- {nproc} CPU cores ({cpu}), {memory} GiB RAM, Linux {kernel}; the clients, the workers and
  PostgreSQL share those cores.
- PostgreSQL {pg_version} on 127.0.0.1: {pg_settings}.
- Python {python}, Django {django}, psycopg {psycopg}. Peers: {peers}.
- Redis (Celery's broker) on 127.0.0.1:6379.

## What is measured

| scenario | how |
|---|---|
| enqueue | Single-row paths (`enqueue()` in autocommit, with and without NOTIFY; `enqueue_on_commit()` inside `atomic()` as a view would; the `django.tasks` backend's `task.enqueue()`) against a raw psycopg `INSERT` + commit per row, in 10 alternating slices. Bulk: `enqueue_many()` against raw `COPY`, same rows per call. Peers: their single and batch APIs, each slice alternating with the raw reference. |
| drain | A backlog is loaded first (50,000 messages in the full run; 5,000 for one-per-transaction and slow consumers), then drained in 10 alternating slices per consumer: raw `DELETE ... SKIP LOCKED RETURNING` at batch 1/10/100; raw lease-then-archive (lease: CTE `SELECT ... FOR UPDATE SKIP LOCKED` + `UPDATE ... RETURNING`; archive: `WITH moved AS (DELETE ... RETURNING) INSERT INTO archive`), with synchronous and asynchronous commit; `Message.objects.lease()` + `core.transitions.complete()` in batches of 100. |
| `pgq_worker` | A real `manage.py pgq_worker` process (persistent connections), idle and listening; a slice of the backlog lands in one transaction with its NOTIFY, and is timed from just before that COMMIT until the live table is empty. Slices alternate with raw lease-then-archive slices. Several `--concurrency` / `--batch-size` settings, and one with `SYNCHRONOUS_ACKS = True`. |
| peers' workers | Each peer's own worker (PgQueuer `QueueManager` in drain mode; Procrastinate `run_worker_async(wait=False)`; django-tasks-db's `db_worker` loop in batch mode, in-process; Celery prefork worker, consumer switched on once the backlog is in Redis), timed inside the adapter, alternating with raw lease-then-archive slices. |
| claim vs backlog | `lease()` + `complete()` in batches of 100 with 1,000 ready messages (drained completely, reloaded, repeated) and with {claim_big} ready messages (first {claim_measured} claimed). The tables are `ANALYZE`d after loading. |
| producers | {producers} producer processes, each a persistent connection doing single-row writes flat out: raw INSERT, raw INSERT + `pg_notify`, `enqueue()` with NOTIFY off and on; alternating rounds. |
| latency | An idle `pgq_worker` and an idle raw LISTEN/NOTIFY + `DELETE ... SKIP LOCKED` loop side by side; the producer alternates between them, 50 messages/s each; the handler reports `time.time()` at its start minus the time stamped just before the enqueue call (same host clock), over UDP. Peers: the same with their own idle worker. |
| steady state | 2 producer processes at a fixed total rate and one `pgq_worker --concurrency 4` together for {steady}s; lag = age of the oldest ready message, sampled every 0.25 s; end-to-end latency as above. |
| memory | Peak RSS (`VmHWM`) of each worker process in the drain runs; one worker through {rss_n} messages (topped up 20,000 at a time), RSS sampled every 0.5 s; slope fitted after the first 10%. |

## Reproduce

```bash
bash bench/run.sh            # full run (~45 minutes on 2 cores)
bash bench/run.sh --quick    # shorter backlogs, 10 s steady state (~15 minutes)
bash bench/run.sh --quick --only enqueue,drain --reps 1 --no-peers
```

`bench/run.sh` creates the peers' virtualenvs under `bench/.venvs/` (git-ignored) from PyPI
on first use, then runs `python -m bench` against `BENCH_SERVER_DSN` (default
`postgresql://postgres@127.0.0.1:5432/postgres`) in a database of its own (`pgq_bench`,
created and dropped). Options: `--reps N` (default 3), `--only` (scenarios: enqueue, drain,
claim, producers, latency, steady, memory), `--peers` / `--no-peers`, `--keep-db`, `--out`.
Results land in `bench/results/<timestamp>-<mode>/`: `results.jsonl` (every case of every
repetition), `report.md` (the tables above), `facts.json` (machine and settings), the plots
and each helper process's log. `python -m bench.publish <that folder>` regenerates this page.
The harness itself is checked by `tests/bench/` (a tiny run: `--mode smoke`).
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--notes", default="")
    args = parser.parse_args()
    folder = Path(args.folder)
    facts = json.loads((folder / "facts.json").read_text())
    report = (folder / "report.md").read_text()
    notes = Path(args.notes).read_text() if args.notes else ""
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
        load=", ".join(f"{x:.1f}" for x in facts["loadavg_start"]),
        reps=facts["reps"],
        notes=notes,
        mode=facts["mode"],
        minutes=round(facts["seconds"] / 60),
        date=folder.name.split("-")[0],
        report=report,
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
    )
    docs = REPO_DIR / "docs"
    (docs / "img").mkdir(exist_ok=True)
    for png in sorted(folder.glob("bench-*.png")):
        shutil.copy(png, docs / "img" / png.name)
    (docs / "benchmarks.md").write_text(page)
    print(f"wrote {docs / 'benchmarks.md'}")


if __name__ == "__main__":
    main()
