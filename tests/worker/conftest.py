"""In-process workers for integration tests: a real Worker on a thread, real PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_pgqueue.worker.runner import Worker, WorkerOptions


class WorkerThread:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.code: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-worker", daemon=True)

    def _run(self) -> None:
        try:
            self.code = self.worker.run()
        except BaseException as exc:  # surfaced by join()
            self.error = exc

    def start(self) -> WorkerThread:
        self.thread.start()
        if not self.worker.ready.wait(10):
            raise AssertionError(f"worker not ready: {self.error!r}")
        return self

    def stop(self, timeout: float = 10) -> int | None:
        self.worker.request_stop()
        return self.join(timeout)

    def join(self, timeout: float = 10) -> int | None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError("worker thread did not stop")
        if self.error is not None:
            raise self.error
        return self.code


@pytest.fixture
def start_worker(transactional_db: None) -> Iterator[Callable[..., WorkerThread]]:
    started: list[WorkerThread] = []

    def start(**options: Any) -> WorkerThread:
        options.setdefault("install_signal_handlers", False)
        options.setdefault("poll_interval", 30)
        runner = WorkerThread(Worker(WorkerOptions(**options))).start()
        started.append(runner)
        return runner

    yield start
    for runner in started:
        if runner.thread.is_alive():
            runner.worker.force_stop()
            runner.thread.join(10)


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it is truthy; fail with a clear message after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
