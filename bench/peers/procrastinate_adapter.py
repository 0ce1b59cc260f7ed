"""Procrastinate adapter (runs in bench/.venvs/procrastinate): psycopg pool, async no-op."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import procrastinate

from bench.config import payload
from bench.peers.protocol import report_latency, serve, trickle, trickle_many

DSN = sys.argv[1]
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=DSN, max_size=12))
state: dict[str, Any] = {"done": 0, "limit": 0}


@app.task(name="noop", queue="bench")
async def noop(**body: Any) -> None:
    state["done"] += 1
    if state["done"] == state["limit"]:
        # Cancelling run_worker_async stops the worker gracefully: no new job starts, the
        # ones running finish.
        state["worker"].cancel()


@app.task(name="latency", queue="bench_latency")
async def latency(**body: Any) -> None:
    report_latency("procrastinate", body)


async def setup() -> None:
    await app.open_async()
    exists = await app.connector.execute_query_one_async(
        "SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS e"
    )
    if not exists["e"]:
        await app.schema_manager.apply_schema_async()


async def reset() -> None:
    await app.connector.execute_query_async("TRUNCATE procrastinate_jobs CASCADE")


async def enqueue(n: str, start: str) -> dict[str, float]:
    t0 = time.perf_counter()
    for i in range(int(start), int(start) + int(n)):
        await noop.defer_async(**payload(i))
    return {"seconds": time.perf_counter() - t0}


async def enqueue_batch(n: str, start: str) -> dict[str, float]:
    t0 = time.perf_counter()
    first, last = int(start), int(start) + int(n)
    for offset in range(first, last, 1000):
        await noop.batch_defer_async(*[payload(i) for i in range(offset, min(offset + 1000, last))])
    return {"seconds": time.perf_counter() - t0}


async def drain(n: str, concurrency: str) -> dict[str, float]:
    """A worker that processes what is there and stops (wait=False)."""
    return await _work(int(concurrency), limit=0)


async def take(n: str, concurrency: str) -> dict[str, float]:
    """The same, stopping once it has run ``n`` jobs, so a part of a huge backlog can be timed.
    The jobs running by then still finish and are counted: up to its concurrency more."""
    return await _work(int(concurrency), limit=int(n))


async def _work(concurrency: int, limit: int) -> dict[str, float]:
    """Jobs run and seconds; ``limit`` 0: no limit."""
    state["done"] = 0
    state["limit"] = limit
    t0 = time.perf_counter()
    worker = asyncio.create_task(
        app.run_worker_async(
            queues=["bench"], concurrency=concurrency, wait=False, install_signal_handlers=False
        )
    )
    state["worker"] = worker
    await asyncio.wait({worker})
    if not worker.cancelled():
        worker.result()
    return {"seconds": time.perf_counter() - t0, "n": state["done"]}


async def serve_latency(concurrency: str = "1") -> dict[str, bool]:
    state["task"] = asyncio.create_task(
        app.run_worker_async(
            queues=["bench_latency"],
            concurrency=int(concurrency),
            wait=True,
            install_signal_handlers=False,
        )
    )
    await asyncio.sleep(1.0)
    return {"ok": True}


async def stop_latency() -> dict[str, bool]:
    state["task"].cancel()
    try:
        await asyncio.wait_for(state["task"], 30)
    except (asyncio.CancelledError, Exception):
        pass
    return {"ok": True}


async def do_trickle(n: str, rate: str, batch: str = "1") -> dict[str, bool]:
    if int(batch) == 1:
        await trickle(int(n), float(rate), lambda body: latency.defer_async(**body))
    else:
        await trickle_many(
            int(n), float(rate), int(batch), lambda bodies: latency.batch_defer_async(*bodies)
        )
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
