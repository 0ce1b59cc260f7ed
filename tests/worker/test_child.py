"""The child's side of ``pgq_worker --processes``: its port report, its memory bound, and how
the supervisor paces restarts."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from django_pgqueue.worker import child
from django_pgqueue.worker.supervisor import describe_exit, restart_delay


def test_the_endpoints_report_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "3.json"
    assert child.read_endpoints(path) is None
    child.report_endpoints(path, 41234)
    assert child.read_endpoints(path) == 41234
    path.write_text("{not json")
    assert child.read_endpoints(path) is None


def test_resident_memory_is_read_from_proc() -> None:
    assert 1 < child.resident_mib() < 100_000
    child.check_memory_bound_supported()


def test_the_memory_bound_stops_once(monkeypatch: object) -> None:
    stopped = threading.Event()
    calls: list[int] = []

    def stop() -> None:
        calls.append(1)
        stopped.set()

    child.WATCH_INTERVAL, previous = 0.01, child.WATCH_INTERVAL
    try:
        bound = child.MemoryBound(1, stop)  # 1 MiB: past it at once
        bound.start()
        assert stopped.wait(5)
        bound._thread.join(5)
    finally:
        child.WATCH_INTERVAL = previous
    assert calls == [1]
    assert bound.reached_mib is not None and bound.reached_mib > 1


def test_a_generous_memory_bound_never_stops() -> None:
    bound = child.MemoryBound(10_000_000, lambda: (_ for _ in ()).throw(AssertionError()))
    bound.start()
    bound.close()
    bound._thread.join(5)
    assert bound.reached_mib is None


def test_restarts_back_off_exponentially_up_to_a_minute() -> None:
    assert [restart_delay(n) for n in range(1, 9)] == [0, 1, 2, 4, 8, 16, 32, 60]
    assert restart_delay(50) == 60


def test_an_exit_is_described_by_code_or_signal_name() -> None:
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-200) == "killed by signal 200"
