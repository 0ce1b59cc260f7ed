"""Celery adapter (runs in bench/.venvs/celery): Redis broker, prefork worker subprocess.

The worker starts consuming only a dummy queue; ``drain`` adds the bench queue as a consumer
(remote control) once the backlog is in Redis, and cancels it when the counter says done."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from bench.config import payload
from bench.peers.celery_app import DONE_KEY, QUEUE, app, counter, latency, noop
from bench.peers.protocol import serve_sync, trickle_sync

state: dict[str, Any] = {}


def _start_worker(concurrency: str) -> None:
    if state.get("concurrency") == concurrency and state["proc"].poll() is None:
        return
    _stop_worker()
    name = f"bench-{os.getpid()}@localhost"
    command = [sys.executable, "-m", "celery", "-A", "bench.peers.celery_app", "worker"]
    command += ["-P", "prefork", "-c", concurrency, "-Q", "pgq_bench_idle", "-n", name]
    command += ["-l", "WARNING", "--without-gossip", "--without-mingle"]
    state["proc"] = subprocess.Popen(command, stdout=sys.stderr, stderr=sys.stderr)
    state["name"], state["concurrency"] = name, concurrency
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if app.control.ping(destination=[name], timeout=0.5):
            return
    raise RuntimeError("celery worker did not start")


def _stop_worker() -> None:
    proc = state.pop("proc", None)
    if proc is not None and proc.poll() is None:
        proc.terminate()
        proc.wait(30)
    state.pop("concurrency", None)


def reset() -> None:
    counter.delete(QUEUE, DONE_KEY)


def enqueue(n: str, start: str) -> dict[str, float]:
    t0 = time.perf_counter()
    for i in range(int(start), int(start) + int(n)):
        noop.apply_async(args=[payload(i)], queue="pgq_bench_load")
    seconds = time.perf_counter() - t0
    counter.delete("pgq_bench_load")
    return {"seconds": seconds}


def load(n: str, start: str) -> dict[str, float]:
    t0 = time.perf_counter()
    for i in range(int(start), int(start) + int(n)):
        noop.apply_async(args=[payload(i)], queue=QUEUE)
    return {"seconds": time.perf_counter() - t0}


def drain(n: str, concurrency: str) -> dict[str, float]:
    _start_worker(concurrency)
    counter.set(DONE_KEY, 0)
    want = int(n)
    t0 = time.perf_counter()
    app.control.add_consumer(QUEUE, destination=[state["name"]], reply=True)
    while int(counter.get(DONE_KEY) or 0) < want:
        time.sleep(0.005)
    seconds = time.perf_counter() - t0
    app.control.cancel_consumer(QUEUE, destination=[state["name"]], reply=True)
    return {"seconds": seconds, "n": int(counter.get(DONE_KEY) or 0)}


def serve_latency() -> dict[str, bool]:
    _start_worker("2")
    app.control.add_consumer("pgq_bench_latency", destination=[state["name"]], reply=True)
    time.sleep(1.0)
    return {"ok": True}


def stop_latency() -> dict[str, bool]:
    _stop_worker()
    return {"ok": True}


def do_trickle(n: str, rate: str) -> dict[str, bool]:
    trickle_sync(
        int(n),
        float(rate),
        lambda body: latency.apply_async(args=[body], queue="pgq_bench_latency"),
    )
    return {"ok": True}


try:
    serve_sync(
        {
            "reset": reset,
            "enqueue": enqueue,
            "load": load,
            "drain": drain,
            "serve_latency": serve_latency,
            "stop_latency": stop_latency,
            "trickle": do_trickle,
        }
    )
finally:
    _stop_worker()
