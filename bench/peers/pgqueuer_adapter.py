"""PgQueuer adapter (runs in bench/.venvs/pgqueuer): asyncpg, QueueManager, async no-op."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import asyncpg
from pgqueuer.db import AsyncpgDriver
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

from bench.config import payload
from bench.peers.protocol import report_latency, serve, trickle, trickle_many

DSN = sys.argv[1]
state: dict[str, Any] = {}


async def setup() -> None:
    conn = await asyncpg.connect(DSN)
    state["conn"] = conn
    state["q"] = Queries(AsyncpgDriver(conn))
    exists = await conn.fetchval("SELECT to_regclass('pgqueuer') IS NOT NULL")
    if not exists:
        await state["q"].install()


async def reset() -> None:
    await state["conn"].execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")


async def enqueue(n: str, start: str) -> dict[str, float]:
    q = state["q"]
    t0 = time.perf_counter()
    for i in range(int(start), int(start) + int(n)):
        await q.enqueue("noop", json.dumps(payload(i)).encode())
    return {"seconds": time.perf_counter() - t0}


async def enqueue_batch(n: str, start: str) -> dict[str, float]:
    q = state["q"]
    t0 = time.perf_counter()
    first, last = int(start), int(start) + int(n)
    for offset in range(first, last, 1000):
        ids = range(offset, min(offset + 1000, last))
        await q.enqueue(
            ["noop"] * len(ids), [json.dumps(payload(i)).encode() for i in ids], [0] * len(ids)
        )
    return {"seconds": time.perf_counter() - t0}


async def drain(n: str, batch: str) -> dict[str, float]:
    """A fresh QueueManager drains the backlog and stops (drain mode)."""
    return await _drain(int(batch), limit=0)


async def take(n: str, batch: str) -> dict[str, float]:
    """The same, stopping once it has run ``n`` jobs, so a part of a huge backlog can be timed.
    The jobs it has dequeued by then still run and are counted: a batch or two more."""
    return await _drain(int(batch), limit=int(n))


async def _drain(batch: int, limit: int) -> dict[str, float]:
    """Jobs run and seconds; ``limit`` 0: no limit."""
    conn = await asyncpg.connect(DSN)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    done = 0

    @qm.entrypoint("noop")
    async def noop(job: Any) -> None:
        nonlocal done
        done += 1
        if done == limit:
            qm.shutdown.set()

    t0 = time.perf_counter()
    await qm.run(mode=QueueExecutionMode.drain, batch_size=batch)
    seconds = time.perf_counter() - t0
    await conn.close()
    return {"seconds": seconds, "n": done}


async def serve_latency(batch: str = "10") -> dict[str, bool]:
    conn = await asyncpg.connect(DSN)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("latency")
    async def latency(job: Any) -> None:
        report_latency("pgqueuer", json.loads(job.payload))

    state["qm"] = qm
    state["task"] = asyncio.create_task(qm.run(batch_size=int(batch)))
    await asyncio.sleep(1.0)
    return {"ok": True}


async def stop_latency() -> dict[str, bool]:
    state["qm"].shutdown.set()
    await asyncio.wait_for(state["task"], 30)
    return {"ok": True}


async def do_trickle(n: str, rate: str, batch: str = "1") -> dict[str, bool]:
    q = state["q"]
    if int(batch) == 1:
        await trickle(
            int(n), float(rate), lambda body: q.enqueue("latency", json.dumps(body).encode())
        )
        return {"ok": True}

    def send_many(bodies: list[dict[str, Any]]) -> Any:
        encoded = [json.dumps(b).encode() for b in bodies]
        return q.enqueue(["latency"] * len(bodies), encoded, [0] * len(bodies))

    await trickle_many(int(n), float(rate), int(batch), send_many)
    return {"ok": True}


serve(
    {
        "reset": reset,
        "enqueue": enqueue,
        "enqueue_batch": enqueue_batch,
        "load": enqueue_batch,
        "drain": drain,
        "take": take,
        "serve_latency": serve_latency,
        "stop_latency": stop_latency,
        "trickle": do_trickle,
    },
    setup,
)
