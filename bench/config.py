"""Run sizes per mode and the payload every system gets."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Sizes:
    """How much work each scenario does; ``full`` is what docs/benchmarks.md reports."""

    name: str
    enqueue_n: int  # single-row enqueues per case
    bulk_n: int  # rows per COPY / enqueue_many case
    drain_n: int  # backlog drained by batched consumers and workers
    drain_slow_n: int  # backlog for one-message-per-transaction consumers (B=1)
    drain_mid_n: int  # backlog for the batch-10 raw consumer
    peer_slow_n: int  # backlog for peers that run a few hundred jobs/s
    latency_n: int  # messages trickled at latency_rate for the latency cases
    latency_rate: float
    claim_small: int  # ready messages in the "small backlog" claim case
    claim_big: int  # ready messages in the "big backlog" claim case
    claim_measured: int  # messages leased + completed in the big case
    producers: int  # concurrent producer processes in the NOTIFY case
    producer_n: int  # single-row enqueues per producer
    steady_seconds: float
    steady_rate: float  # messages/s offered by the producers in the steady state
    rss_n: int  # messages through one worker in the long RSS run
    worker_settings: tuple[tuple[int, int], ...]  # (concurrency, batch size) pairs


FULL = Sizes(
    name="full",
    enqueue_n=2_000,
    bulk_n=50_000,
    drain_n=50_000,
    drain_slow_n=2_000,
    drain_mid_n=10_000,
    peer_slow_n=1_000,
    latency_n=300,
    latency_rate=50.0,
    claim_small=1_000,
    claim_big=1_000_000,
    claim_measured=5_000,
    producers=8,
    producer_n=500,
    steady_seconds=60.0,
    steady_rate=300.0,
    rss_n=1_000_000,
    worker_settings=((1, 100), (4, 10), (16, 100), (4, 100)),
)

QUICK = replace(
    FULL,
    name="quick",
    bulk_n=20_000,
    drain_n=20_000,
    drain_slow_n=1_000,
    drain_mid_n=5_000,
    latency_n=150,
    claim_big=100_000,
    claim_measured=3_000,
    producer_n=250,
    steady_seconds=10.0,
    rss_n=100_000,
    worker_settings=((1, 100), (4, 100)),
)

# Keeps the harness from rotting (tests/bench/test_bench_smoke.py): seconds, not minutes.
SMOKE = replace(
    QUICK,
    name="smoke",
    enqueue_n=200,
    bulk_n=500,
    drain_n=500,
    drain_slow_n=200,
    drain_mid_n=300,
    peer_slow_n=200,
    latency_n=20,
    claim_small=300,
    claim_big=3_000,
    claim_measured=300,
    producers=2,
    producer_n=50,
    steady_seconds=2.0,
    steady_rate=200.0,
    rss_n=2_000,
    worker_settings=((2, 100),),
)

MODES = {s.name: s for s in (FULL, QUICK, SMOKE)}

QUEUE = "bench"
TASK = "bench.noop"
LATENCY_TASK = "bench.latency"


def payload(i: int) -> dict[str, object]:
    """A ~100-byte JSON document, different per message."""
    return {
        "user_id": 100_000 + i,
        "action": "send-welcome-email",
        "template": "welcome_v2",
        "ref": f"{i:012d}",
    }


PAYLOAD_BYTES = len(json.dumps(payload(0)))
