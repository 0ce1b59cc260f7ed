"""The line protocol between the harness and a peer adapter (runs inside the peer's venv,
so stdlib only). The adapter prints "ready", then for every stdin line ``<command> <args>``
prints one JSON line; ``exit`` ends it. Commands may be coroutines: a peer's worker can keep
running on the event loop between commands."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
_port = int(os.environ.get("BENCH_UDP_PORT", "0"))


def report_latency(tag: str, body: Any) -> None:
    """Called first thing in a peer's handler: enqueue-call start -> handler start."""
    started = time.time()
    if _port and isinstance(body, dict) and "t" in body:
        _sock.sendto(f"{tag}:{(started - body['t']) * 1000:.4f}".encode(), ("127.0.0.1", _port))


def stamped(i: int) -> dict[str, Any]:
    from bench.config import payload

    body = payload(i)
    body["t"] = time.time()
    return body


def trickle_sync(n: int, rate: float, send: Callable[[dict[str, Any]], Any]) -> None:
    """Call ``send(body)`` n times at ``rate`` per second, bodies stamped with time.time()."""
    t0 = time.perf_counter()
    for k in range(n):
        delay = t0 + k / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(stamped(k))


async def trickle(n: int, rate: float, send: Callable[[dict[str, Any]], Any]) -> None:
    """``trickle_sync`` on the event loop (``send`` may return an awaitable)."""
    t0 = time.perf_counter()
    for k in range(n):
        delay = t0 + k / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        result = send(stamped(k))
        if inspect.isawaitable(result):
            await result


async def trickle_many(
    n: int, rate: float, batch: int, send_many: Callable[[list[dict[str, Any]]], Any]
) -> None:
    """``trickle`` in calls of ``batch`` messages (the peer's batch API)."""
    t0 = time.perf_counter()
    for k in range(0, n, batch):
        delay = t0 + k / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        result = send_many([stamped(i) for i in range(k, min(n, k + batch))])
        if inspect.isawaitable(result):
            await result


def serve(commands: dict[str, Callable[..., Any]], setup: Callable[[], Any] | None = None) -> None:
    asyncio.run(_serve(commands, setup))


async def _serve(commands: dict[str, Callable[..., Any]], setup: Callable[[], Any] | None) -> None:
    loop = asyncio.get_running_loop()
    if setup is not None:
        result = setup()
        if inspect.isawaitable(result):
            await result
    print("ready", flush=True)
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        command, *args = line.split()
        try:
            result = None if command == "exit" else commands[command](*args)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # report, keep serving: the harness decides
            result = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result if result is not None else {"ok": True}), flush=True)
        if command == "exit":
            return


def serve_sync(
    commands: dict[str, Callable[..., Any]], setup: Callable[[], Any] | None = None
) -> None:
    """The same protocol without an event loop (for synchronous libraries like Django)."""
    if setup is not None:
        setup()
    print("ready", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        try:
            result = None if command == "exit" else commands[command](*args)
        except Exception as exc:
            result = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result if result is not None else {"ok": True}), flush=True)
        if command == "exit":
            return
