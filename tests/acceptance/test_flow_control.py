"""Fairness and limits with real concurrent ``pgq_worker`` processes.

The workers run with ``tests.acceptance.flow_settings`` (the flow-controlled queues) and the
``flow.record`` handler, which logs, from inside the handler, how many messages of its queue
and of its key the database counts as in flight (leases not yet expired).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

import django_pgqueue
from django_pgqueue.core.operations import pause_queue
from django_pgqueue.models import ArchivedMessage, Message, WorkerHeartbeat
from tests.acceptance import flow_settings
from tests.dsn import database_url

REPO = Path(settings.REPO_DIR)
WORKER_COMMAND = REPO / "django_pgqueue" / "management" / "commands" / "pgq_worker.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not WORKER_COMMAND.exists(), reason="pgq_worker is not there"),
]


@pytest.fixture
def flow_log(tmp_path: Path) -> Path:
    path = tmp_path / "flow.jsonl"
    path.touch()
    return path


class Workers:
    """Worker subprocesses of one test; every one still running at the end is killed."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.procs: list[subprocess.Popen[str]] = []

    def start(
        self,
        *queues: str,
        hang: bool = False,
        poll: float = 0.05,
        listen: bool = False,
        extra: tuple[str, ...] = (),
    ) -> Any:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.acceptance.flow_settings",
            "DATABASE_URL": database_url(),
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "example_project")]),
            "PGQ_FLOW_LOG": str(self.log),
        }
        if hang:
            env["PGQ_FLOW_HANG"] = "1"
        command = [sys.executable, "-m", "django", "pgq_worker"]
        command += [] if listen else ["--no-listen"]
        command += ["--poll-interval", str(poll), *extra]
        for queue in queues:
            command += ["--queue", queue]
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.procs.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen[str], timeout: float = 90) -> str:
        out, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, out
        return out

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)


@pytest.fixture
def workers(flow_log: Path) -> Iterator[Workers]:
    pool = Workers(flow_log)
    yield pool
    pool.stop_all()


def records(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def enqueue(queue: str, key: str | None, count: int, **payload: Any) -> list[int]:
    # With the workers' settings, as a web process of the same project would enqueue (a fair
    # queue's messages take their place in its fair order at enqueue).
    with override_settings(PGQUEUE=flow_settings.PGQUEUE):
        return [
            django_pgqueue.enqueue(
                "flow.record",
                {"queue": queue, "key": key, "seq": n, **payload},
                queue=queue,
                tenant=key,
            ).id
            for n in range(count)
        ]


def wait_for_workers(count: int, timeout: float = 60.0) -> None:
    """Until ``count`` workers have registered (the row each writes just before it serves)."""
    deadline = time.monotonic() + timeout
    while WorkerHeartbeat.objects.count() < count:
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.1)


def max_overlap(runs: list[dict[str, Any]]) -> int:
    """Most handler runs open at one instant (start/end events of every run)."""
    events = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    open_now = peak = 0
    for _, step in events:
        open_now += step
        peak = max(peak, open_now)
    return peak


def test_a_queue_limit_is_never_exceeded_by_several_workers(workers: Workers, flow_log: Path):
    enqueue("flow-limited", None, 36, sleep=0.05)
    procs = [
        workers.start("flow-limited", extra=("--concurrency", "4", "--max-messages", "12"))
        for _ in range(3)
    ]
    for proc in procs:
        workers.wait(proc)
    runs = records(flow_log)
    assert len(runs) == 36 and not Message.objects.filter(queue="flow-limited").exists()
    assert max(r["in_flight"] for r in runs) <= 3  # what the database saw, from inside
    assert max_overlap(runs) <= 3
    assert max_overlap(runs) >= 2  # the workers did run side by side
    assert len({r["pid"] for r in runs}) >= 2


@pytest.mark.parametrize("listen", [False, True], ids=["polling", "listening"])
def test_a_worker_claims_again_when_room_comes_back_not_at_its_next_poll(
    workers: Workers, flow_log: Path, listen: bool
):
    """The limit of 3 cuts every claim of 4 short, and no NOTIFY says when room comes back:
    the worker claims again as its outcomes are written, so 24 messages go through long
    before one poll interval (30 s) has passed (listening, the first claim is the listener's,
    on the NOTIFY of the enqueue)."""
    workers.start("flow-limited", poll=30, listen=listen, extra=("--concurrency", "4"))
    wait_for_workers(1)
    with transaction.atomic():
        enqueue("flow-limited", None, 24, sleep=0.01)
    deadline = time.monotonic() + 25
    while ArchivedMessage.objects.filter(queue="flow-limited").count() < 24:
        assert time.monotonic() < deadline, "the worker waited for its poll interval"
        time.sleep(0.1)
    runs = records(flow_log)
    assert len(runs) == 24 and max(r["in_flight"] for r in runs) <= 3


def test_limits_hold_across_workers_claiming_under_allowances(workers: Workers, flow_log: Path):
    """3 workers x 16 handlers want 48 at once, over the queue limit of 40; a heavy tenant
    ("a") reaches its key limit of 30 once the light ones are done. Exact claims far from both
    limits reserve allowances, which the workers lease without counting: what the database
    counts from inside every handler stays within both limits."""
    options = ("--concurrency", "16", "--batch-size", "2", "--max-messages", "80")
    procs = [workers.start("flow-allowances", extra=options) for _ in range(3)]
    # All three press at once only if they are up before the work arrives: their runs are
    # short, and a process start under load can take longer than a whole run.
    wait_for_workers(3)
    with transaction.atomic():
        enqueue("flow-allowances", "a", 150, sleep=0.2)
        enqueue("flow-allowances", "b", 45, sleep=0.2)
        enqueue("flow-allowances", "c", 45, sleep=0.2)
    for proc in procs:
        workers.wait(proc)
    runs = records(flow_log)
    assert len(runs) == 240 and not Message.objects.filter(queue="flow-allowances").exists()
    assert max(r["in_flight"] for r in runs) <= 40
    assert max(r["key_in_flight"] for r in runs) <= 30
    assert max(r["in_flight"] for r in runs) >= 32  # the workers did press on the limits
    assert any(r["allowances_live"] for r in runs)  # and allowances were in play


def test_a_key_limit_of_one_runs_each_keys_messages_one_at_a_time_in_order(
    workers: Workers, flow_log: Path
):
    for key in ("a", "b", "c"):
        enqueue("flow-keyed", key, 8, sleep=0.02)
    procs = [
        workers.start("flow-keyed", extra=("--concurrency", "4", "--max-messages", "12"))
        for _ in range(2)
    ]
    for proc in procs:
        workers.wait(proc)
    runs = records(flow_log)
    assert len(runs) == 24
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        by_key[run["key"]].append(run)
    for key_runs in by_key.values():
        assert max(r["key_in_flight"] for r in key_runs) == 1
        assert max_overlap(key_runs) == 1
        in_start_order = sorted(key_runs, key=lambda r: r["start"])
        assert [r["seq"] for r in in_start_order] == list(range(8))
    assert max_overlap(runs) >= 2  # different keys did run at the same time


def test_a_killed_workers_slot_is_freed_when_its_lease_expires(workers: Workers, flow_log: Path):
    [stuck] = enqueue("flow-crash", "k", 1, hang=True)
    enqueue("flow-crash", "k", 2)
    doomed = workers.start("flow-crash", hang=True, extra=("--concurrency", "2"))
    deadline = time.monotonic() + 30
    while not Message.objects.filter(id=stuck, lease_token__isnull=False).exists():
        assert time.monotonic() < deadline, "the first worker never leased the message"
        time.sleep(0.05)
    time.sleep(0.3)
    # Key limit 1: while the hanging handler holds the slot nothing else of the key is leased.
    assert Message.objects.filter(queue="flow-crash", lease_token__isnull=False).count() == 1
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate(timeout=10)
    # A fresh worker gets everything done once the dead worker's lease (2 s) runs out.
    rescuer = workers.start("flow-crash", extra=("--concurrency", "2", "--max-messages", "3"))
    workers.wait(rescuer, timeout=60)
    assert not Message.objects.filter(queue="flow-crash").exists()
    runs = records(flow_log)
    assert len(runs) == 3 and max(r["key_in_flight"] for r in runs) == 1
    redelivered = next(r for r in runs if r["id"] == stuck)
    # The killed lease gave its attempt back: its handler was not running alone.
    assert redelivered["attempt"] == 1


def test_a_heavy_tenant_does_not_delay_a_light_one(workers: Workers, flow_log: Path):
    enqueue("flow-fair", "heavy", 400)
    light = enqueue("flow-fair", "light", 4)
    proc = workers.start(
        "flow-fair", extra=("--concurrency", "2", "--batch-size", "2", "--max-messages", "60")
    )
    workers.wait(proc)
    # In lease order (``started_at`` is the lease time; completions are archived in batches,
    # so ``finished_at`` groups several messages).
    leased = list(
        ArchivedMessage.objects.filter(queue="flow-fair")
        .order_by("started_at", "message_id")
        .values_list("message_id", flat=True)
    )
    positions = [leased.index(message_id) for message_id in light]
    # The bound documented in docs/how-to/fairness-and-limits.md: the light tenant's k-th
    # message is leased within its k-th round (2 tenants -> 2 messages a round), plus what
    # the worker holds already (max(concurrency, batch size) = 2): position < 2k + 2.
    assert all(pos < 2 * (k + 1) + 2 for k, pos in enumerate(sorted(positions))), positions


def test_a_fair_message_committed_late_runs_while_a_backlog_is_worked_off(workers: Workers):
    """The worker walks the fair order from its bounds: a message that took its place at the
    head of the order in a transaction that commits after the bounds moved past it is found
    by the worker's head watcher, and runs long before the backlog is done."""
    with override_settings(PGQUEUE=flow_settings.PGQUEUE):
        bodies = (
            {"queue": "flow-fair", "key": "heavy", "seq": n, "sleep": 0.005} for n in range(3000)
        )
        django_pgqueue.enqueue_many("flow.record", bodies, queue="flow-fair", tenant="heavy")
    archived = ArchivedMessage.objects.filter(queue="flow-fair")
    with transaction.atomic():
        [late] = enqueue("flow-fair", "late", 1)
        assert Message.objects.get(pk=late).fair_order == 0  # the head of the order
        workers.start("flow-fair", extra=("--concurrency", "2", "--batch-size", "20"))
        deadline = time.monotonic() + 60
        while archived.count() < 300:
            assert time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.05)
    deadline = time.monotonic() + 30
    while not archived.filter(message_id=late).exists():
        assert time.monotonic() < deadline, "the late message did not run"
        time.sleep(0.05)
    assert Message.objects.filter(queue="flow-fair", tenant="heavy").count() > 500


def test_a_rate_limit_holds_across_workers(workers: Workers):
    enqueue("flow-rate", None, 60)
    procs = [
        workers.start("flow-rate", extra=("--concurrency", "4", "--max-messages", "30"))
        for _ in range(2)
    ]
    for proc in procs:
        workers.wait(proc)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM started_at) FROM pgqueue_archive WHERE queue = 'flow-rate' "
            "ORDER BY started_at"
        )
        starts = [float(row[0]) for row in cursor.fetchall()]
    assert len(starts) == 60
    # Token bucket of 20/s with a burst of 20: any 1 s window holds at most 20 x (1 + 1.2)
    # leases (an allowance may lease its tokens up to 0.2 s after they were spent), and 60
    # leases need at least (60 - 20) / 20 = 2 s of database time, less that 0.2 s.
    assert starts[-1] - starts[0] >= (2.0 - 0.2) * 0.95
    for n, t0 in enumerate(starts):
        in_window = sum(1 for t in starts[n:] if t - t0 <= 1.0)
        assert in_window <= 20 * (1 + 1.2)


def test_a_paused_queue_is_not_touched(workers: Workers, flow_log: Path):
    paused = enqueue("flow-paused", None, 5)
    pause_queue("flow-paused")
    enqueue("flow-limited", None, 3)
    proc = workers.start("flow-paused", "flow-limited", extra=("--burst",))
    workers.wait(proc)
    assert {r["id"] for r in records(flow_log)}.isdisjoint(paused)
    untouched = Message.objects.filter(id__in=paused)
    assert untouched.count() == 5
    assert all(m.attempts == 0 and m.lease_token is None for m in untouched)
    assert not Message.objects.filter(queue="flow-limited").exists()
