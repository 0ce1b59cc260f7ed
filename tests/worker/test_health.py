"""``pgq_worker --health-port``: liveness and readiness probes of real worker processes.

200 with ``{"status": "ok"}`` while the worker runs; readiness 503 while it drains; both 503
when the database is unreachable (no round trip within ``--health-db-timeout``) or an
internal thread stopped on an error (``faultapp``'s fault-injection seam).
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import django_pgqueue
from tests.acceptance.conftest import (  # noqa: F401 (fixture)
    WorkerProcess,
    database_closed,
    spawn_worker,
)

from .conftest import wait_for
from .http_probe import endpoint_port, get, probe, run_pgq_worker

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
Spawn = Callable[..., WorkerProcess]


def healthy(
    spawn: Spawn, *args: str, env: dict[str, str] | None = None
) -> tuple[WorkerProcess, int]:
    worker = spawn("--health-port", "0", "--poll-interval", "0.3", *args, env=env).ready()
    port = endpoint_port(worker, "/healthz")
    wait_for(lambda: probe(port, "/readyz")[0] == 200)
    return worker, port


def test_both_probes_say_ok_while_the_worker_runs(spawn_worker: Spawn) -> None:  # noqa: F811
    worker, port = healthy(spawn_worker)
    for path in ("/healthz", "/readyz"):
        status, body = probe(port, path)
        assert status == 200, body
        assert body["status"] == "ok" and body["problems"] == []
        assert body["worker_id"] == worker.worker_id
    assert get(port, "/metrics")[0] == 404  # metrics only where --metrics-port says
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_readiness_fails_while_draining_and_liveness_holds(
    spawn_worker: Spawn,  # noqa: F811
    tmp_path: Path,
) -> None:
    worker, port = healthy(spawn_worker, "--grace-period", "20")
    started, release = tmp_path / "started", tmp_path / "release"
    # The handler runs until the probes are done: the worker drains all along.
    django_pgqueue.enqueue(
        "tests.sleep", {"seconds": 15, "started_file": str(started), "release_file": str(release)}
    )
    wait_for(started.exists)
    worker.signal(signal.SIGTERM)
    status, body = wait_for(lambda: (s := probe(port, "/readyz"))[0] == 503 and s)
    assert body["problems"] == ["draining"] and body["in_flight"] == 1
    status, body = probe(port, "/healthz")
    assert status == 200, body
    release.touch()
    assert worker.wait() == 0


@pytest.mark.chaos
def test_both_fail_when_the_database_is_unreachable(
    spawn_worker: Spawn,  # noqa: F811
    admin_conn: psycopg.Connection[object],
) -> None:
    # --visibility-timeout 3: a heartbeat every second, so the limit may be 2s.
    worker, port = healthy(
        spawn_worker, "--visibility-timeout", "3", "--no-listen", "--health-db-timeout", "2"
    )
    with database_closed(admin_conn, worker.worker_id):
        for path in ("/healthz", "/readyz"):
            _, body = wait_for(lambda p=path: (s := probe(port, p))[0] == 503 and s)
            assert any("no successful database round trip" in p for p in body["problems"])
    wait_for(lambda: probe(port, "/healthz")[0] == 200, timeout=15)
    wait_for(lambda: probe(port, "/readyz")[0] == 200)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_both_fail_once_an_internal_thread_died(
    spawn_worker: Spawn,  # noqa: F811
    tmp_path: Path,
) -> None:
    trigger, started, release = tmp_path / "trigger", tmp_path / "started", tmp_path / "release"
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.worker.fault_settings",
        "PGQ_FAULT": "main loop",
        "PGQ_FAULT_TRIGGER": str(trigger),
    }
    worker, port = healthy(spawn_worker, "--grace-period", "20", env=env)
    # A running handler keeps the stopping worker (and its probes) up until it is released.
    django_pgqueue.enqueue(
        "tests.sleep", {"seconds": 15, "started_file": str(started), "release_file": str(release)}
    )
    wait_for(started.exists)
    trigger.touch()
    _, body = wait_for(lambda: (s := probe(port, "/healthz"))[0] == 503 and s)
    assert body["problems"] == ["internal error in the main loop thread"]
    assert probe(port, "/readyz")[0] == 503
    release.touch()
    assert worker.wait(timeout=20) == 1


def test_a_worker_stopped_by_a_fault_stops_answering(spawn_worker: Spawn, tmp_path: Path) -> None:  # noqa: F811
    trigger = tmp_path / "trigger"
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.worker.fault_settings",
        "PGQ_FAULT": "listener",
        "PGQ_FAULT_TRIGGER": str(trigger),
    }
    worker, port = healthy(spawn_worker, "--grace-period", "20", env=env)
    trigger.touch()
    django_pgqueue.enqueue("tests.echo", "wake the listener")
    assert worker.wait(timeout=20) == 1
    # Exited: nothing answers any more, which a probe counts as a failure too.
    with pytest.raises(OSError):
        probe(port, "/healthz")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("--health-port", "70000"), "--health-port: must be a port number in [0, 65535]"),
        (("--metrics-port", "http"), "--metrics-port: must be a port number in [0, 65535]"),
        (("--health-port", "0", "--health-db-timeout", "0"), "--health-db-timeout: invalid"),
        (("--health-db-timeout", "30"), "--health-db-timeout needs --health-port"),
        (
            ("--health-port", "0", "--health-db-timeout", "3"),
            "must be longer than the poll interval and the heartbeat interval",
        ),
    ],
)
def test_bad_flag_values_are_rejected_clearly(args: tuple[str, ...], error: str) -> None:
    result = run_pgq_worker(*args)
    assert result.returncode != 0
    assert error in result.stderr, result.stderr


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_pgq_worker("--health-port", str(port), "--http-host", "127.0.0.1")
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr, result.stderr
