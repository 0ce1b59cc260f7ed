"""Soak: many messages, several worker processes, random SIGKILLs, a database restart; then
an accounting of every message.

CI runs a smaller soak by default; the full one is one line::

    PGQUEUE_SOAK_MESSAGES=20000 .venv/bin/python -m pytest tests/acceptance/test_soak.py -s

``PGQUEUE_SOAK_SEED`` replays a run's choices (which messages are poison, when and which
worker is killed; the timing of a real machine still varies); ``PGQUEUE_SOAK_WORKERS`` sets
the number of worker processes. The accounting is printed (``-s`` to see it).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from .cluster import PrivateCluster
from .conftest import WorkerProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.chaos,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(1800),
]
Spawn = Callable[..., WorkerProcess]

MESSAGES = int(os.environ.get("PGQUEUE_SOAK_MESSAGES", "5000"))
WORKERS = int(os.environ.get("PGQUEUE_SOAK_WORKERS", "3"))
MAX_ATTEMPTS = 3


def insert(conn: psycopg.Connection[Any], payloads: list[dict[str, Any]]) -> list[int]:
    rows = conn.execute(
        "INSERT INTO pgqueue_message (queue, task, payload, max_attempts) "
        "SELECT 'default', 'tests.soak', p::jsonb, %s FROM unnest(%s::text[]) AS p "
        "RETURNING id",
        [MAX_ATTEMPTS, [json.dumps(p) for p in payloads]],
    ).fetchall()
    return [r[0] for r in rows]


def payloads(rng: random.Random, n: int, poison_every: int) -> list[dict[str, Any]]:
    return [{"poison": True} if rng.randrange(poison_every) == 0 else {} for _ in range(n)]


def test_soak_every_committed_message_is_accounted_for(
    spawn_worker: Spawn,
    private_cluster: PrivateCluster,
    cluster_db: psycopg.Connection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed = int(os.environ.get("PGQUEUE_SOAK_SEED", str(random.randrange(10**6))))
    rng = random.Random(seed)
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    monkeypatch.setenv("PGQUEUE_SOAK_RUNS", str(runs_dir))
    kills_planned = max(3, MESSAGES // 2500)
    began = time.monotonic()

    # What is committed, and what is rolled back (ids taken, never visible).
    kind: dict[int, str] = {}
    first = payloads(rng, MESSAGES // 2, poison_every=1000)
    first[rng.randrange(len(first))] = {"crash": True}
    for message_id, payload in zip(insert(cluster_db, first), first, strict=True):
        kind[message_id] = "poison" if "poison" in payload else "crash" if payload else "ok"
    with cluster_db.transaction(force_rollback=True):
        rolled_back = set(insert(cluster_db, [{} for _ in range(100)]))

    def spawn() -> WorkerProcess:
        return spawn_worker(
            # --queue: see test_attempt_rule.py (issue #25, item 6).
            *("--queue", "default", "--poll-interval", "0.2", "--visibility-timeout", "4"),
            database=private_cluster.url,
        )

    workers = [spawn() for _ in range(WORKERS)]
    killed: set[int] = set()  # pids SIGKILLed, or dead on their own (the crasher)
    kills = crashes = 0
    restarted = False
    second: list[dict[str, Any]] = []
    next_kill = time.monotonic() + rng.uniform(2.0, 4.0)
    db = cluster_db

    def live() -> int:
        row = db.execute("SELECT count(*) FROM pgqueue_message").fetchone()
        return int(row[0]) if row else 0

    while True:
        for i, worker in enumerate(workers):
            if worker.proc.poll() is not None:  # died on its own: the crasher
                killed.add(worker.proc.pid)
                crashes += 1
                workers[i] = spawn()
        now = time.monotonic()
        if kills < kills_planned and now >= next_kill:
            i = rng.randrange(len(workers))
            workers[i].signal(signal.SIGKILL)
            workers[i].wait()
            killed.add(workers[i].proc.pid)
            kills += 1
            workers[i] = spawn()
            next_kill = now + rng.uniform(2.0, 4.0)
        done = db.execute("SELECT count(*) FROM pgqueue_archive").fetchone()
        if not restarted and done and done[0] >= MESSAGES // 4:
            private_cluster.restart("fast")
            restarted = True
            db = private_cluster.connect()
            second = payloads(rng, MESSAGES - MESSAGES // 2, poison_every=1000)
            for message_id, payload in zip(insert(db, second), second, strict=True):
                kind[message_id] = "poison" if payload else "ok"
        if restarted and kills >= kills_planned and live() == 0:
            break
        assert time.monotonic() - began < 1500, "the soak did not settle"
        time.sleep(0.1)
    for worker in workers:
        worker.ready()  # a worker spawned late may still be starting: SIGTERM would kill it
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(60) == 0, worker.output
    elapsed = time.monotonic() - began

    archived = dict(db.execute("SELECT message_id, attempts FROM pgqueue_archive").fetchall())
    dead = {
        r[0]: (r[1], r[2])
        for r in db.execute("SELECT message_id, reason, attempts FROM pgqueue_dead").fetchall()
    }
    db.close()
    runs: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for log in runs_dir.glob("runs-*.log"):
        for line in log.read_text().splitlines():
            message_id, pid, attempt = map(int, line.split())
            runs[message_id].append((pid, attempt))

    committed = set(kind)
    poison = {i for i, k in kind.items() if k == "poison"}
    crasher = {i for i, k in kind.items() if k == "crash"}
    # Each run past what the message owes (ok: 1; poison: its attempts; the crasher: none)
    # must be explained by a lease holder that was killed.
    owed = {"ok": 1, "poison": MAX_ATTEMPTS, "crash": 0}
    unexplained = {
        i: runs[i]
        for i in committed
        if sum(1 for pid, _ in runs[i] if pid not in killed) > owed[kind[i]]
    }
    # Runs of a message past its first (past its attempts for a poison one).
    duplicates = sum(max(0, len(runs[i]) - owed[kind[i]]) for i in committed if kind[i] != "crash")
    attempts = Counter(archived.values())
    print(
        f"\nsoak seed={seed}: {len(committed)} committed ({len(poison)} poison, "
        f"{len(crasher)} crasher), {len(rolled_back)} rolled back, {WORKERS} workers, "
        f"{kills} SIGKILLs + {crashes} crashes, 1 database restart, {elapsed:.0f}s\n"
        f"  archived {len(archived)} (attempts: {dict(sorted(attempts.items()))}), "
        f"dead {len(dead)} ({dict(Counter(r for r, _ in dead.values()))})\n"
        f"  runs {sum(len(r) for r in runs.values())} (the crasher's: "
        f"{sum(len(runs[i]) for i in crasher)}), duplicate runs {duplicates}, messages run "
        f"more often than a killed lease holder explains: {len(unexplained)}, rolled-back "
        f"messages run: {len(rolled_back & set(runs))}"
    )
    assert not set(archived) & set(dead)
    assert set(archived) | set(dead) == committed
    assert set(dead) == poison | crasher
    assert all(dead[i] == ("error", MAX_ATTEMPTS) for i in poison)
    assert all(dead[i] == ("lease_expired", MAX_ATTEMPTS) for i in crasher)
    assert not rolled_back & set(runs)
    assert all(runs[i] for i in archived)
    assert unexplained == {}
