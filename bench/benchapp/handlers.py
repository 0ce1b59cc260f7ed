"""No-op handlers for the benchmark."""

import os
import socket
import time
from typing import Any

import django_pgqueue

_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
_port = int(os.environ.get("BENCH_UDP_PORT", "0"))


@django_pgqueue.handler("bench.noop", queue="bench")
def noop(payload: Any) -> None:
    """Does nothing: the benchmark measures the queue, not the work."""


@django_pgqueue.handler("bench.latency", queue="bench")
def latency(payload: Any) -> None:
    """Reports enqueue-call start -> handler start (ms) to the harness over UDP."""
    started = time.time()
    if _port and isinstance(payload, dict) and "t" in payload:
        _sock.sendto(f"pgq:{(started - payload['t']) * 1000:.4f}".encode(), ("127.0.0.1", _port))


@django_pgqueue.handler("bench.timed", queue="bench")
def timed(payload: Any) -> dict[str, float]:
    """Returns when it started and ended (host clock): a chain's gaps between steps."""
    start = time.time()
    return {"start": start, "end": time.time()}


#: Iterations of ``bench.cpu``'s loop unless the payload names another number.
CPU_LOOPS = 300_000


@django_pgqueue.handler("bench.cpu", queue="bench")
def cpu(payload: Any) -> int:
    """A fixed amount of pure-Python work (holds the GIL throughout): what processes buy."""
    loops = payload.get("loops", CPU_LOOPS) if isinstance(payload, dict) else CPU_LOOPS
    total = 0
    for i in range(loops):
        total += i * i % 7
    return total
