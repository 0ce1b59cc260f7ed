"""The base of the worker's parts (worker/service.py): a service's lifecycle and supervision,
a chore's timer."""

from __future__ import annotations

import time

from django_pgqueue.worker.service import Chore, Service


class Waiting(Service):
    name = "waiting"

    def run(self) -> None:
        self.halt.wait()


class Broken(Service):
    name = "broken"

    def run(self) -> None:
        raise RuntimeError("a bug")


def test_a_service_starts_and_stops_again_and_again() -> None:
    for _ in range(50):
        service = Waiting()
        assert not service.started and not service.is_alive()
        service.start()
        assert service.is_alive()
        service.stop()
        service.join(5)
        assert service.started and not service.is_alive()


def test_an_error_escaping_a_service_is_reported_with_what_it_was_doing() -> None:
    reported: list[tuple[str, str]] = []
    service = Broken(on_crash=lambda doing, exc: reported.append((doing, str(exc))))
    service.start()
    service.join(5)
    assert reported == [("broken", "a bug")]
    assert not service.is_alive()


class Counting(Chore):
    def __init__(self, interval: float, later: float | None = None) -> None:
        super().__init__(interval)
        self.runs = 0
        self.later = later

    def run(self) -> float | None:
        self.runs += 1
        return self.later


def test_a_chore_runs_when_due_and_times_its_next_run() -> None:
    chore = Counting(10.0)
    now = time.monotonic()
    chore.run_if_due(now)
    assert chore.runs == 0  # not due for 10 s
    chore.run_if_due(chore.next_at)
    assert chore.runs == 1
    assert chore.next_at >= now + 10.0
    chore.retime(0.0)
    chore.later = 60.0  # the job itself says when it is due next
    chore.run_if_due(time.monotonic())
    assert chore.runs == 2 and chore.next_at >= time.monotonic() + 59.0
