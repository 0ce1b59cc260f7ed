"""Three real ``pgq_worker`` processes share one schedule: each slot is enqueued exactly once."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from django_pgqueue.models import (
    ArchivedMessage,
    DeadMessage,
    Message,
    PeriodicSchedule,
    WorkerHeartbeat,
)
from tests.acceptance.conftest import REPO, database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PERIOD = 2  # seconds: tests/acceptance/periodicapp/handlers.py


def start_worker(worker_id: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.acceptance.periodic_settings",
        "DATABASE_URL": database_url(),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "example_project")]),
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-m", "django", "pgq_worker", "--worker-id", worker_id]
    command += ["--queue", "periodic-accept", "--concurrency", "2"]
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def live_workers() -> int:
    return WorkerHeartbeat.objects.filter(worker_id__startswith="periodic-").count()


def enqueued_slots() -> list[str]:
    payloads = [
        *Message.objects.filter(queue="periodic-accept").values_list("payload", flat=True),
        *ArchivedMessage.objects.filter(queue="periodic-accept").values_list("payload", flat=True),
        *DeadMessage.objects.filter(queue="periodic-accept").values_list("payload", flat=True),
    ]
    return [p["slot"] for p in payloads]


def test_three_workers_enqueue_each_slot_exactly_once() -> None:
    workers = [start_worker(f"periodic-{n}") for n in range(3)]
    started = time.monotonic()
    try:
        # Three Django processes start on a busy CI machine: their start-up gets its own
        # deadline, and the schedule is timed only from when all three are up.
        deadline = started + 90
        while time.monotonic() < deadline and live_workers() < 3:
            time.sleep(0.2)
        assert live_workers() == 3, [w.poll() for w in workers]
        up = time.monotonic()
        first = len(enqueued_slots())
        deadline = up + 20 * PERIOD
        while time.monotonic() < deadline and len(enqueued_slots()) < first + 5:
            time.sleep(0.2)
        waited = time.monotonic() - up
    finally:
        outputs = []
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            out, _ = worker.communicate(timeout=60)
            outputs.append(out)
    assert all(w.returncode == 0 for w in workers), "\n".join(outputs)
    slots = sorted(dt.datetime.fromisoformat(s) for s in enqueued_slots())
    log = "\n".join(line for out in outputs for line in out.splitlines() if "eriodic" in line)
    counts = Counter(slots)
    timing = f"up after {up - started:.1f}s, then {waited:.1f}s for {len(slots) - first} slots"
    assert len(slots) >= first + 5, f"{timing}\n" + "\n".join(outputs)
    assert max(counts.values()) == 1, counts  # no slot twice
    steps = {(b - a).total_seconds() for a, b in itertools.pairwise(slots)}
    assert steps == {PERIOD}, log  # none missed in between
    assert PeriodicSchedule.objects.get(name="tests.periodic-tick").last_run_at == slots[-1]
