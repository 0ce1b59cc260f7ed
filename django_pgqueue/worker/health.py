"""The worker's health probes, as a Kubernetes probe reads them: 200 or 503, a short JSON body.

- **liveness** (``/healthz``): every internal thread is running (none stopped on an internal
  error) and a database round trip succeeded within ``--health-db-timeout`` seconds. A
  failing liveness means "restart me".
- **readiness** (``/readyz``): live, started, not draining (after SIGTERM, ``--burst`` done or
  a fault), and the LISTEN connection up when the worker listens.

Neither probe queries the database: the worker notes each successful round trip it makes
anyway (heartbeat, polls, claims), so a probe costs nothing and never waits on an outage.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .endpoints import Response
    from .runner import Worker
    from .service import Service

#: Default of ``--health-db-timeout``: seconds without a successful database round trip
#: after which the worker is neither live nor ready.
DEFAULT_DB_TIMEOUT = 60.0

LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"


def db_timeout(
    requested: float | None, *, poll_interval: float, heartbeat_interval: float
) -> float:
    """``--health-db-timeout``, checked: an idle worker reaches the database once per poll
    and per heartbeat, so a shorter limit would fail a healthy worker between two of them."""
    if requested is None:
        return max(DEFAULT_DB_TIMEOUT, 3 * poll_interval)
    floor = max(poll_interval, heartbeat_interval)
    if not requested > floor:
        raise ValueError(
            f"the health database timeout ({requested:g}s) must be longer than the poll "
            f"interval and the heartbeat interval (here {floor:g}s)"
        )
    return float(requested)


def dead_threads(worker: Worker) -> list[str]:
    """The worker's threads that should be running and are not."""
    dead = []
    if worker.main_thread is not None and not worker.main_thread.is_alive():
        dead.append("main loop")
    # The listener and the head watcher stop first when the worker drains, on purpose.
    services: list[Service | None] = [worker.completer]
    if not worker.draining:
        services += [worker.listener, worker.head_watcher]
    dead += [s.name for s in services if s is not None and s.started and not s.is_alive()]
    return dead + worker.executor.dead_threads()


def liveness_problems(worker: Worker, db_timeout: float) -> list[str]:
    problems = [f"the {name} thread is not running" for name in dead_threads(worker)]
    if worker.crashed is not None:
        problems.append(f"internal error in the {worker.crashed} thread")
    silence = worker.database_silence()
    if silence > db_timeout:
        problems.append(f"no successful database round trip for {silence:.0f}s")
    return problems


def readiness_problems(worker: Worker, db_timeout: float) -> list[str]:
    problems = liveness_problems(worker, db_timeout)
    if not worker.ready.is_set():
        problems.append("starting")
    if worker.draining:
        problems.append("draining")  # its listener stops then, on purpose
    elif worker.listener is not None and not worker.listener.connected:
        problems.append("the LISTEN connection is down")
    return problems


def respond(worker: Worker, problems: list[str]) -> Response:
    body = {
        "status": "fail" if problems else "ok",
        "worker_id": worker.worker_id,
        "problems": problems,
        "database_silence_seconds": round(worker.database_silence(), 3),
        "in_flight": worker.executor.in_flight(),
    }
    return (
        503 if problems else 200,
        "application/json",
        json.dumps(body).encode() + b"\n",
    )
