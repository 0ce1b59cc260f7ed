"""The completion statement as shipped against a plain join with ``unnest()`` of the batch.

Self-contained (creates and drops ``pgq_flow_bench`` like ``flow_control_bench.py``; run it
alone: never beside another benchmark or the tests)::

    .venv/bin/python bench/ack_shapes.py [--messages N] [--batch N] [--rounds N]

``core/_sql.py``'s ``COMPLETE`` takes the batch as arrays in one ``NOT MATERIALIZED`` row and
finds its rows with ``m.id = ANY(b.ids)`` (an index condition on the primary key in any plan),
each row's token and result looked up by ``array_position`` (``_sql.LEASE_IN_BATCH``). The
reference here is the plain join of the table with ``unnest()`` of the batch on id and token.
Both run as the shipped acknowledgements do: session-prepared,
``plan_cache_mode = force_generic_plan`` and ``_execution.BY_ID_PLAN`` (no hash or merge
join, no sequential scan), each completing ``--messages`` leased messages in batches of
``--batch``, in turns (the order alternates every round), in two cases:

- *planned on the backlog*: prepared after the leased messages were loaded and analyzed;
- *planned on a few rows*: prepared and run while the table held 4 analyzed leases, then the
  messages loaded (a worker that started on a near-empty queue, before a backlog arrived).

Prints messages completed per second and the backend's CPU per message (from
``/proc/<pid>/schedstat``: the server must run on this host).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import flow_control_bench as flow_bench  # noqa: E402
from bench.claim_cpu import backend_cpu  # noqa: E402

JOINED_WITH_UNNEST = """
WITH done AS (
    DELETE FROM pgqueue_message m
    USING unnest($1::bigint[], $2::uuid[], $3::text[]) AS d(id, token, result)
    WHERE m.id = d.id AND m.lease_token = d.token
    RETURNING m.*, d.result
)
INSERT INTO pgqueue_archive
    (message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
     max_attempts, errors, started_at, finished_at, worker_id, result)
SELECT id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
       max_attempts, errors, leased_at, now(), leased_by, result::jsonb
FROM done
RETURNING message_id
"""

LOAD_LEASED = """
INSERT INTO pgqueue_message (queue, task, payload, lease_token, leased_at, leased_by,
                             available_at, attempts)
SELECT 'acks', 'bench.noop', '{"n": 1}', gen_random_uuid(), now(), 'bench',
       now() + interval '5 minutes', 1
FROM generate_series(1, %s)
"""


def session_settings() -> dict[str, str]:
    """What the shipped acknowledgements run under (``core/transitions.py``)."""
    from django_pgqueue.core._execution import BY_ID_PLAN

    return {"plan_cache_mode": "force_generic_plan", "synchronous_commit": "off", **BY_ID_PLAN}


def shipped() -> str:
    from django_pgqueue.core import _sql

    statement = _sql.COMPLETE
    for number in (1, 2, 3):
        statement = statement.replace("%s", f"${number}", 1)
    return statement


def array(values: list[object]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


def complete_all(cursor, name: str, batch: int) -> int:  # type: ignore[no-untyped-def]
    leases = cursor.execute("SELECT id, lease_token FROM pgqueue_message ORDER BY id").fetchall()
    done = 0
    for start in range(0, len(leases), batch):
        chunk = leases[start : start + batch]
        cursor.execute(
            f"EXECUTE {name}(%s, %s, NULL)",
            [array([row[0] for row in chunk]), array([row[1] for row in chunk])],
        )
        done += len(cursor.fetchall())
    return done


def measure(messages: int, batch: int, rounds: int) -> dict[tuple[str, str], list[tuple]]:
    import psycopg
    from django.db import connection

    connection.ensure_connection()
    dsn = connection.connection.info.dsn
    results: dict[tuple[str, str], list[tuple]] = {}
    shapes = {"shipped": shipped(), "joined_with_unnest": JOINED_WITH_UNNEST}
    for case in ("planned on the backlog", "planned on a few rows"):
        for turn in range(rounds):
            order = list(shapes) if turn % 2 == 0 else list(reversed(shapes))
            for name in order:
                # A new session each time: its statement is planned afresh.
                with psycopg.connect(
                    dsn, autocommit=True, cursor_factory=psycopg.ClientCursor
                ) as conn:
                    cursor = conn.cursor()
                    for setting, value in session_settings().items():
                        cursor.execute(f"SET {setting} = {value}")
                    cursor.execute("TRUNCATE pgqueue_message, pgqueue_archive")
                    prepare = f"PREPARE {name}(bigint[], uuid[], text[]) AS {shapes[name]}"
                    if case == "planned on a few rows":
                        cursor.execute(LOAD_LEASED, [4])
                        cursor.execute("ANALYZE pgqueue_message")
                        cursor.execute(prepare)
                        complete_all(cursor, name, batch)
                    cursor.execute(LOAD_LEASED, [messages])
                    if case == "planned on the backlog":
                        cursor.execute("ANALYZE pgqueue_message")
                        cursor.execute(prepare)
                    cursor.execute("CHECKPOINT")
                    pid = conn.info.backend_pid
                    cpu, start = backend_cpu(pid), time.perf_counter()
                    done = complete_all(cursor, name, batch)
                    seconds, cpu_after = time.perf_counter() - start, backend_cpu(pid)
                    assert done == messages, (name, done)
                    cpu_us = None
                    if cpu is not None and cpu_after is not None:
                        cpu_us = (cpu_after - cpu) / done * 1e6
                    results.setdefault((case, name), []).append((done / seconds, cpu_us))
    return results


def report(results: dict[tuple[str, str], list[tuple]], messages: int, batch: int) -> None:
    print(f"## Completing {messages:,} leased messages in batches of {batch} (median of rounds)\n")
    print("| case | statement | completed/s (min-max) | backend CPU us/msg | shipped ÷ reference |")
    print("|---|---|--:|--:|--:|")
    for (case, name), runs in results.items():
        rates = [rate for rate, _ in runs]
        cpus = [cpu for _, cpu in runs if cpu is not None]
        reference = statistics.median(rate for rate, _ in results[(case, "joined_with_unnest")])
        print(
            f"| {case} | {name} | {statistics.median(rates):,.0f} "
            f"({min(rates):,.0f}-{max(rates):,.0f}) | "
            f"{statistics.median(cpus) if cpus else float('nan'):,.1f} | "
            f"{statistics.median(rates) / reference:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="leased messages a run")
    parser.add_argument("--batch", type=int, default=100, help="messages per statement")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each statement a case")
    args = parser.parse_args()
    with flow_bench.migrated_database():
        report(measure(args.messages, args.batch, args.rounds), args.messages, args.batch)


if __name__ == "__main__":
    main()
