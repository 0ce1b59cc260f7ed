"""``pgq_worker --processes N`` and recycling: a real supervisor and its real worker processes.

Each test runs one supervisor (``spawn_worker``) whose children are ``pgq_worker`` processes
of their own; their log lines come through the supervisor's output.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

import django_pgqueue
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message
from tests.acceptance.conftest import WorkerProcess, spawn_worker  # noqa: F401 (fixture)
from tests.testapp.models import Effect

from .conftest import wait_for
from .http_probe import get, probe, run_pgq_worker

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
Spawn = Callable[..., WorkerProcess]


def child_pid(supervisor: WorkerProcess, n: int) -> int:
    line = supervisor.wait_for_line(rf"Started worker process \S+\.{n} \(pid \d+\)")
    return int(re.search(r"\(pid (\d+)\)", line).group(1))  # type: ignore[union-attr]


def supervisor_port(supervisor: WorkerProcess) -> int:
    line = supervisor.wait_for_line(r"supervisor \S+ serves .* on http://")
    return int(line.rsplit(":", 1)[1])


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def all_archived(total: int) -> bool:
    return ArchivedMessage.objects.count() == total and not Message.objects.exists()


def assert_archived_once(total: int) -> None:
    assert ArchivedMessage.objects.count() == total
    assert ArchivedMessage.objects.values("message_id").distinct().count() == total
    assert not Message.objects.exists() and not DeadMessage.objects.exists()


@pytest.mark.chaos
def test_a_child_killed_mid_batch_is_replaced_and_its_messages_run_once(
    spawn_worker: Spawn,  # noqa: F811
) -> None:
    total = 24
    django_pgqueue.enqueue_many("tests.sleep", [{"seconds": 0.4, "n": n} for n in range(total)])
    supervisor = spawn_worker(
        "--processes", "2", "--concurrency", "2", "--batch-size", "4",
        "--visibility-timeout", "2", "--poll-interval", "0.3",
    )  # fmt: skip
    first = child_pid(supervisor, 1)
    wait_for(lambda: Message.objects.filter(leased_by=f"{supervisor.worker_id}.1").exists())
    os.kill(first, signal.SIGKILL)
    supervisor.wait_for_line(
        rf"Worker process \S+\.1 \(pid {first}\) died: killed by SIGKILL after running "
        r"[\d.]+s; restarting it now \(crash 1 in a row\)"
    )
    child_pid(supervisor, 3)  # its replacement
    wait_for(lambda: all_archived(total), timeout=30)
    assert_archived_once(total)
    supervisor.wait_for_line(r"Message \d+ .*redelivered")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait() == 0


def test_sigterm_drains_every_child_and_exits_zero(
    spawn_worker: Spawn,  # noqa: F811
    tmp_path: Path,
) -> None:
    total = 4
    supervisor = spawn_worker("--processes", "2", "--concurrency", "2", "--batch-size", "2")
    pids = [child_pid(supervisor, 1), child_pid(supervisor, 2)]
    for n in (1, 2):
        supervisor.wait_for_line(rf"pgq_worker \S+\.{n} ready: ")
    django_pgqueue.enqueue_many(
        "tests.sleep",
        [{"seconds": 1.5, "started_file": str(tmp_path / f"{n}")} for n in range(total)],
    )
    wait_for(lambda: len(list(tmp_path.iterdir())) >= 2, timeout=20)
    supervisor.signal(signal.SIGTERM)
    running = len(list(tmp_path.iterdir()))
    assert supervisor.wait() == 0
    assert all(gone(pid) for pid in pids)
    # What ran finished and was archived; what waited was handed back; nothing is held.
    assert ArchivedMessage.objects.count() >= running
    assert ArchivedMessage.objects.count() + Message.objects.count() == total
    assert not Message.objects.filter(lease_token__isnull=False).exists()
    supervisor.wait_for_line(r"SIGTERM: draining 2 worker processes")
    for n in (1, 2):
        supervisor.wait_for_line(rf"pgq_worker \S+\.{n} stopped: ")
    assert "died" not in supervisor.output
    assert re.search(r"supervisor \S+ stopped \(exit 0\)", supervisor.output)


@pytest.mark.chaos
def test_sigkill_of_the_supervisor_leaves_no_lease_held(
    spawn_worker: Spawn,  # noqa: F811
    tmp_path: Path,
) -> None:
    total = 12
    supervisor = spawn_worker(
        "--processes", "2", "--concurrency", "2", "--batch-size", "6",
        "--visibility-timeout", "120",
    )  # fmt: skip
    pids = [child_pid(supervisor, 1), child_pid(supervisor, 2)]
    for n in (1, 2):
        supervisor.wait_for_line(rf"pgq_worker \S+\.{n} ready: ")
    django_pgqueue.enqueue_many(
        "tests.sleep",
        [{"seconds": 1, "started_file": str(tmp_path / f"{n}")} for n in range(total)],
    )
    wait_for(lambda: len(list(tmp_path.iterdir())) >= 2, timeout=20)
    supervisor.signal(signal.SIGKILL)
    running = len(list(tmp_path.iterdir()))
    assert supervisor.wait() == -signal.SIGKILL
    # The children drain (a second at most here) and exit, far within the visibility timeout.
    wait_for(lambda: all(gone(pid) for pid in pids), timeout=20)
    assert not Message.objects.filter(lease_token__isnull=False).exists()
    archived = ArchivedMessage.objects.count()
    # What ran finished; what waited was handed back.
    assert running <= archived < total, supervisor.output
    assert len(re.findall(r"SIGTERM: finishing \d+ in-flight", supervisor.output)) == 2
    assert Message.objects.count() == total - archived
    assert not DeadMessage.objects.exists()


def test_recycling_under_load_loses_and_duplicates_nothing(spawn_worker: Spawn) -> None:  # noqa: F811
    total = 600
    django_pgqueue.enqueue_many("tests.effect", [{"n": n} for n in range(total)])
    supervisor = spawn_worker(
        "--processes", "2", "--max-tasks-per-child", "60", "--burst",
        "--concurrency", "4", "--batch-size", "25",
    )  # fmt: skip
    assert supervisor.wait(90) == 0, supervisor.output
    assert_archived_once(total)
    # UNIQUE(message_id): a second run of any message would have failed, not added a row.
    assert Effect.objects.count() == total
    assert not Effect.objects.filter(attempt__gt=1).exists()
    recycles = re.findall(r"recycled after [\d.]+s \(--max-tasks-per-child 60\)", supervisor.output)
    assert len(recycles) >= total // 60 - 1
    assert "died" not in supervisor.output
    assert len(set(Effect.objects.values_list("worker_pid", flat=True))) >= total // 60


def test_a_child_past_its_memory_bound_is_recycled_between_messages(
    spawn_worker: Spawn,  # noqa: F811
) -> None:
    total = 200
    # 1 MiB: every child passes it at its first look, a second after it starts.
    supervisor = spawn_worker(
        "--max-memory-per-child", "1", "--concurrency", "2", "--batch-size", "5",
        "--poll-interval", "0.5",
    )  # fmt: skip
    supervisor.wait_for_line(r"pgq_worker \S+\.1 ready: ")
    django_pgqueue.enqueue_many("tests.sleep", [{"seconds": 0.02, "effect": True}] * total)
    wait_for(lambda: all_archived(total), timeout=60)
    assert_archived_once(total)
    assert Effect.objects.count() == total
    supervisor.wait_for_line(r"Resident memory \d+ MiB is past --max-memory-per-child 1 MiB")
    supervisor.wait_for_line(r"recycled after [\d.]+s \(--max-memory-per-child 1\)")
    assert "died" not in supervisor.output
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait() == 0


def test_one_metrics_endpoint_sums_the_children(spawn_worker: Spawn) -> None:  # noqa: F811
    pytest.importorskip("prometheus_client")  # the [metrics] extra
    total = 300
    django_pgqueue.enqueue_many("tests.effect", [{"n": n} for n in range(total)])
    supervisor = spawn_worker(
        "--processes", "2", "--metrics-port", "0", "--health-port", "0",
        "--concurrency", "2", "--batch-size", "10",
    )  # fmt: skip
    port = supervisor_port(supervisor)
    wait_for(lambda: all_archived(total), timeout=30)
    processed = (
        r'pgqueue_worker_messages_processed_total\{queue="default",task="tests.effect"\} (\S+)'
    )

    def summed() -> float:
        status, body = get(port, "/metrics")
        assert status == 200
        match = re.search(processed, body)
        return float(match.group(1)) if match else 0.0

    wait_for(lambda: summed() == total, timeout=10)  # the completer's last writes counted

    def children() -> set[str]:
        body = get(port, "/metrics")[1]
        return set(re.findall(r'pgqueue_worker_info\{[^}]*worker_id="([^"]+)"', body))

    # A child may drain the backlog alone before the other has opened its port.
    wait_for(
        lambda: children() == {f"{supervisor.worker_id}.1", f"{supervisor.worker_id}.2"},
        timeout=15,
    )
    assert 'pgqueue_supervisor_children{state="running"} 2.0' in get(port, "/metrics")[1]
    wait_for(lambda: probe(port, "/readyz")[0] == 200, timeout=15)
    status, answer = probe(port, "/healthz")
    assert status == 200 and len(answer["children"]) == 2
    # A child that dies takes none of the group's counts with it.
    os.kill(child_pid(supervisor, 1), signal.SIGKILL)
    supervisor.wait_for_line(r"Worker process \S+\.1 .* died: killed by SIGKILL")
    assert summed() == total
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait() == 0


def test_health_fails_while_a_child_crash_loops(spawn_worker: Spawn) -> None:  # noqa: F811
    # Every child gives up on an unreachable database at once; the supervisor needs none.
    supervisor = spawn_worker(
        "--processes", "1", "--max-tasks-per-child", "10", "--health-port", "0",
        "--startup-timeout", "0",
        database="postgres://postgres@127.0.0.1:1/nowhere",
    )  # fmt: skip
    port = supervisor_port(supervisor)
    supervisor.wait_for_line(r"died: exit code 1 after running [\d.]+s; restarting it now")

    def crash_loop() -> bool:
        status, answer = probe(port, "/healthz")
        return status == 503 and any("crash loop" in p for p in answer["problems"])

    wait_for(crash_loop, timeout=30, interval=0.2)
    supervisor.wait_for_line(r"restarting it in 2s \(crash 3 in a row: crash loop\)")
    supervisor.signal(signal.SIGTERM)
    supervisor.wait()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("--processes", "2", "--max-messages", "5"), "use --max-tasks-per-child"),
        (("--max-tasks-per-child", "5", "--healthcheck-file", "/tmp/x"), "use --health-port"),
        (("--processes", "0"), "--processes"),
        (("--processes", "2", "--concurrency", "2", "--queue", "a", "--exclude-queue", "a"),
         "nothing to do"),
    ],
)  # fmt: skip
def test_flags_a_supervisor_cannot_run_with_are_refused(args: tuple[str, ...], error: str) -> None:
    result = run_pgq_worker(*args)
    assert result.returncode != 0
    assert error in result.stderr
    assert "Started worker process" not in result.stderr
