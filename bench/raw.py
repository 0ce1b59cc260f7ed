"""Raw psycopg references: what PostgreSQL itself does on the same tables' shape.

A minimal queue table with a claim index and an archive, autocommit connections (each
statement its own transaction), the same payloads as every other system.
"""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .config import QUEUE, TASK, payload

SCHEMA = """
CREATE TABLE IF NOT EXISTS raw_q (
    id bigserial PRIMARY KEY,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    available_at timestamptz NOT NULL DEFAULT now(),
    attempts int NOT NULL DEFAULT 0,
    lease_token uuid
);
CREATE INDEX IF NOT EXISTS raw_q_claim ON raw_q (queue, available_at, id);
CREATE TABLE IF NOT EXISTS raw_archive (
    id bigint PRIMARY KEY,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    attempts int NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now()
);
"""

INSERT = "INSERT INTO raw_q (queue, payload) VALUES (%s, %s)"
INSERT_NOTIFY = (
    "WITH i AS (INSERT INTO raw_q (queue, payload) VALUES (%s, %s)) SELECT pg_notify('raw_q', %s)"
)
COPY = "COPY raw_q (queue, payload) FROM STDIN"

DELETE_BATCH = """
DELETE FROM raw_q WHERE id IN (
    SELECT id FROM raw_q WHERE queue = %s AND available_at <= now()
    ORDER BY available_at, id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id, payload
"""

LEASE = """
WITH c AS (
    SELECT id FROM raw_q WHERE queue = %s AND available_at <= now()
    ORDER BY available_at, id LIMIT %s FOR UPDATE SKIP LOCKED)
UPDATE raw_q q
SET attempts = q.attempts + 1, lease_token = gen_random_uuid(),
    available_at = now() + interval '30 seconds'
FROM c WHERE q.id = c.id
RETURNING q.id, q.lease_token, q.payload
"""

ARCHIVE = """
WITH moved AS (
    DELETE FROM raw_q q USING unnest(%s::bigint[], %s::uuid[]) AS d(id, token)
    WHERE q.id = d.id AND q.lease_token = d.token
    RETURNING q.*)
INSERT INTO raw_archive (id, queue, payload, attempts)
SELECT id, queue, payload, attempts FROM moved
"""


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def create_schema(dsn: str) -> None:
    with connect(dsn) as conn:
        conn.execute(SCHEMA)


def reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute("TRUNCATE raw_q, raw_archive RESTART IDENTITY")


def insert_one_by_one(conn: psycopg.Connection[Any], n: int, start: int = 0) -> int:
    """Single-row INSERT, one commit each (autocommit)."""
    for i in range(start, start + n):
        conn.execute(INSERT, [QUEUE, Jsonb(payload(i))])
    return n


def insert_notify_one_by_one(conn: psycopg.Connection[Any], n: int, start: int = 0) -> int:
    """Single-row INSERT and its NOTIFY in one statement, one commit each (autocommit)."""
    for i in range(start, start + n):
        conn.execute(INSERT_NOTIFY, [QUEUE, Jsonb(payload(i)), QUEUE])
    return n


def enqueue_statement_one_by_one(
    conn: psycopg.Connection[Any], n: int, start: int = 0, *, on_commit: bool = False
) -> int:
    """django-pgqueue's own single-row INSERT + NOTIFY (``_sql.ENQUEUE``, prepared), sent
    raw into its table, one commit each: ``enqueue()`` without its Python. With
    ``on_commit``, each sent from a ``transaction.on_commit()`` hook of an ``atomic()`` block
    of Django's, as ``enqueue_on_commit()`` in ``atomic()`` sends it (the block runs no
    statement, so it sends none: the INSERT goes in autocommit after it)."""
    from django.db import transaction

    from django_pgqueue.core import _sql

    params: dict[str, Any] = {
        "queue": QUEUE,
        "task": TASK,
        "headers": None,
        "priority": 0,
        "tenant": None,
        "dedup_key": None,
        "max_attempts": 3,
        "composed": False,
        "run_at": None,
        "delay": 0.0,
        "channel": "django_pgqueue",
        "wake": QUEUE,
    }
    with conn.cursor() as cur:
        for i in range(start, start + n):
            params["payload"] = json.dumps(payload(i))
            if on_commit:
                with transaction.atomic():
                    transaction.on_commit(lambda: cur.execute(_sql.ENQUEUE, params, prepare=True))
            else:
                cur.execute(_sql.ENQUEUE, params, prepare=True)
    return n


def copy_rows(conn: psycopg.Connection[Any], n: int, start: int = 0, queue: str = QUEUE) -> int:
    """COPY ``n`` rows in one transaction (payloads serialised here, as a client would)."""
    with conn.transaction(), conn.cursor() as cur, cur.copy(COPY) as copy:
        for i in range(start, start + n):
            copy.write_row((queue, json.dumps(payload(i))))
    return n


# django-pgqueue's live table reproduced for the bulk reference: its columns, defaults,
# identity, CHECKs and every index (the partial unique dedup index too); it has no trigger
# and no foreign key to leave out. LIKE does not copy storage parameters: its autovacuum
# settings are copied after.
LIVE_COPY_TABLE = "raw_live"
LIVE_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {LIVE_COPY_TABLE} (LIKE pgqueue_message INCLUDING ALL);
DO $$ BEGIN
    EXECUTE format('ALTER TABLE {LIVE_COPY_TABLE} SET (%s)', (
        SELECT array_to_string(reloptions, ', ') FROM pg_class
        WHERE oid = 'pgqueue_message'::regclass AND reloptions IS NOT NULL));
END $$;
"""
# The columns and values enqueue_many() writes (core/_sql.py BULK_COPY).
COPY_LIVE = f"""
COPY {LIVE_COPY_TABLE} (queue, task, max_attempts, available_at, headers, payload, priority,
                        tenant, dedup_key, fair_order) FROM STDIN
"""


try:
    import orjson

    def _dumps(value: Any) -> str:
        return orjson.dumps(value).decode()
except ImportError:

    def _dumps(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"))


def empty_live_copy(conn: psycopg.Connection[Any]) -> None:
    """The live table's copy, empty (created after the migrations, when missing)."""
    conn.execute(LIVE_SCHEMA)
    conn.execute(f"TRUNCATE {LIVE_COPY_TABLE} RESTART IDENTITY")


def copy_live_rows(
    conn: psycopg.Connection[Any],
    n: int,
    start: int = 0,
    queue: str = QUEUE,
    *,
    dedup: bool = False,
    tenant: str | None = None,
    fair: bool = False,
) -> int:
    """COPY the rows ``enqueue_many()`` writes for the same arguments into the live table's
    copy, in one transaction: its keys (``key-<i>``), tenant and, in a fair queue, places a
    step apart; no look-up and no NOTIFY. The COPY text is written by hand, one write a
    transaction, its payloads encoded by orjson when installed, as the library's are: the
    client's part stays below the library's (``write_row`` of ten columns and
    ``json.dumps`` would make the client the bottleneck)."""
    null = "\\N"
    head = f"{queue}\t{TASK}\t3\tnow\t{null}\t"
    lines = []
    for i in range(start, start + n):
        body = _dumps(payload(i)).replace("\\", "\\\\")
        key = f"key-{i}" if dedup else null
        place = float(i) if fair else null
        lines.append(f"{head}{body}\t0\t{tenant or null}\t{key}\t{place}\n")
    with conn.transaction(), conn.cursor() as cur, cur.copy(COPY_LIVE) as copy:
        copy.write("".join(lines))
    return n


def delete_drain(
    conn: psycopg.Connection[Any], batch: int, limit: int | None = None, queue: str = QUEUE
) -> int:
    """``DELETE ... SKIP LOCKED RETURNING`` batches until the queue is empty (or ``limit``)."""
    done = 0
    while limit is None or done < limit:
        want = batch if limit is None else min(batch, limit - done)
        rows = conn.execute(DELETE_BATCH, [queue, want]).fetchall()
        if not rows:
            return done
        for _id, body in rows:
            noop(body)
        done += len(rows)
    return done


def lease_archive_drain(
    conn: psycopg.Connection[Any], batch: int, limit: int | None = None, queue: str = QUEUE
) -> int:
    """Two statements per batch: lease (UPDATE ... RETURNING), then archive (DELETE -> INSERT)."""
    done = 0
    while limit is None or done < limit:
        want = batch if limit is None else min(batch, limit - done)
        rows = conn.execute(LEASE, [queue, want]).fetchall()
        if not rows:
            return done
        for _id, _token, body in rows:
            noop(body)
        conn.execute(ARCHIVE, [[r[0] for r in rows], [r[1] for r in rows]])
        done += len(rows)
    return done


def noop(body: Any) -> None:
    """The handler: does nothing with the decoded payload."""


def listen_worker(dsn: str, udp_port: int, ready_file: str) -> None:
    """An idle LISTEN/NOTIFY consumer: wakes on a notification, takes what is ready with a
    DELETE ... SKIP LOCKED, and reports enqueue -> start latency over UDP."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listen = connect(dsn)
    work = connect(dsn)
    listen.execute("LISTEN raw_q")
    with open(ready_file, "w") as ready:
        ready.write("ready")
    while True:
        for _ in listen.notifies(timeout=1.0, stop_after=1):
            while True:
                rows = work.execute(DELETE_BATCH, [QUEUE, 100]).fetchall()
                if not rows:
                    break
                for _id, body in rows:
                    latency_ms = (time.time() - body["t"]) * 1000
                    sock.sendto(f"raw:{latency_ms:.4f}".encode(), ("127.0.0.1", udp_port))


if __name__ == "__main__":
    import sys

    listen_worker(sys.argv[1], int(sys.argv[2]), sys.argv[3])
