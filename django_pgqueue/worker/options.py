"""What a worker is asked to do: the ``pgq_worker`` flags as :class:`WorkerOptions`."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..conf import MAX_BATCH_SIZE, MAX_CONCURRENCY
from ..core._validation import validate_queue_name
from .endpoints import DEFAULT_HOST

#: Seconds a starting worker tries to reach its database before it exits 1 (--startup-timeout).
STARTUP_TIMEOUT = 15.0


@dataclass
class WorkerOptions:
    """What ``manage.py pgq_worker`` flags set; ``None`` means the ``PGQUEUE`` setting."""

    queues: list[str] = field(default_factory=list)
    exclude_queues: list[str] = field(default_factory=list)
    concurrency: int | None = None
    batch_size: int | None = None
    visibility_timeout: float | None = None
    poll_interval: float | None = None
    listen: bool = True
    burst: bool = False
    max_messages: int | None = None
    worker_id: str | None = None
    healthcheck_file: str | Path | None = None
    grace_period: float | None = None
    install_signal_handlers: bool = True
    #: Serve ``/metrics`` (needs prometheus_client) on this port; 0: any free port (logged).
    metrics_port: int | None = None
    #: Serve ``/healthz`` and ``/readyz`` on this port (may be the metrics port).
    health_port: int | None = None
    #: The address both endpoints listen on (by default this host only).
    http_host: str = DEFAULT_HOST
    #: Seconds without a successful database round trip after which the health probes fail.
    health_db_timeout: float | None = None
    #: Seconds a starting worker tries to reach its database before it gives up (exit 1).
    startup_timeout: float = STARTUP_TIMEOUT


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def check_sizes(concurrency: int, batch_size: int, max_messages: int | None) -> None:
    """Raise ValueError for sizes a worker cannot run with."""
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency must be a whole number in [1, {MAX_CONCURRENCY}]")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"batch size must be a whole number in [1, {MAX_BATCH_SIZE}]")
    if max_messages is not None and max_messages < 1:
        raise ValueError("max_messages must be >= 1")


def served_queues(options: WorkerOptions) -> tuple[list[str], set[str]]:
    """The ``--queue`` names (validated, in order, the excluded ones left out; empty: every
    queue) and the ``--exclude-queue`` names."""
    excluded = {validate_queue_name(q) for q in options.exclude_queues}
    fixed = [validate_queue_name(q) for q in dict.fromkeys(options.queues)]
    fixed = [q for q in fixed if q not in excluded]
    if options.queues and not fixed:
        raise ValueError("every --queue is also excluded: nothing to do")
    return fixed, excluded
