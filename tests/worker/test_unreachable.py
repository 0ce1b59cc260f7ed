"""A database the worker cannot reach: at start it fails in one clear line within
``--startup-timeout``; once running it keeps saying it retries; SIGTERM is quiet meanwhile.
Real ``pgq_worker`` processes."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.acceptance.conftest import WorkerProcess, database_closed, spawn_worker  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
Spawn = Callable[..., WorkerProcess]


def closed_port_url() -> str:
    """A database address where nothing listens (a port just freed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"postgres://postgres@127.0.0.1:{port}/nowhere"


def problem_lines(worker: WorkerProcess) -> list[str]:
    return [line for line in worker.lines if " WARNING " in line or " ERROR " in line]


@pytest.mark.parametrize("burst", [True, False], ids=["burst", "long-running"])
def test_a_wrong_database_address_fails_the_start_in_one_clear_line(
    spawn_worker: Spawn,  # noqa: F811
    burst: bool,
) -> None:
    args = ["--startup-timeout", "2", *(["--burst"] if burst else [])]
    started = time.monotonic()
    worker = spawn_worker(*args, database=closed_port_url())
    assert worker.wait(timeout=30) == 1, worker.output
    assert time.monotonic() - started < 20
    assert "Traceback" not in worker.output
    # One warning when the first try fails, one error when the bound is reached.
    warning, error = problem_lines(worker)
    assert "retrying for up to 2" in warning
    assert "Cannot reach the database" in error
    assert "127.0.0.1" in error and "nowhere" in error and "Connection refused" in error
    assert "--startup-timeout" in error
    assert " ready: " not in worker.output


def test_sigterm_while_the_start_waits_for_the_database_is_quiet(
    spawn_worker: Spawn,  # noqa: F811
) -> None:
    worker = spawn_worker(database=closed_port_url())
    worker.wait_for_line("retrying for up to")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0, worker.output
    assert "Traceback" not in worker.output
    assert " ready: " not in worker.output


@pytest.mark.slow
def test_a_running_worker_keeps_saying_it_retries_and_stops_quietly_meanwhile(
    spawn_worker: Spawn,  # noqa: F811
    admin_conn: psycopg.Connection[Any],
) -> None:
    worker = spawn_worker("--poll-interval", "0.5").ready()
    with database_closed(admin_conn, worker.worker_id):
        worker.wait_for_line("Database unavailable during", timeout=10)
        # Not silent for minutes: the outage is reported again while it lasts.
        worker.wait_for_line(r"Database still unavailable during .* after \d+s", timeout=20)
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0, worker.output
    assert "Traceback" not in worker.output
