"""Real ``manage.py pgq_worker`` subprocesses against the test database."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import connection_kwargs
from tests.dsn import database_url

from .cluster import PrivateCluster, unavailable_reason

REPO = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """One worker subprocess; its log lines are collected as they come."""

    def __init__(
        self,
        args: list[str],
        worker_id: str,
        env: dict[str, str] | None = None,
        database: str | None = None,
    ) -> None:
        self.worker_id = worker_id
        environment = dict(os.environ)
        environment.update(
            DJANGO_SETTINGS_MODULE="tests.settings",
            DATABASE_URL=database or database_url(),
            PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "example_project")]),
            PYTHONUNBUFFERED="1",
            # A worker that hangs is sent SIGABRT by wait(): every thread's stack is printed.
            PYTHONFAULTHANDLER="1",
        )
        environment.update(env or {})  # e.g. another DJANGO_SETTINGS_MODULE
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "pgq_worker", "--worker-id", worker_id, *args],
            cwd=REPO,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, timeout: float = 20) -> str:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for line in self.lines[seen:]:
                if regex.search(line):
                    return line
            seen = len(self.lines)
            if self.proc.poll() is not None and seen == len(self.lines):
                time.sleep(0.05)
                if not any(regex.search(x) for x in self.lines):
                    raise AssertionError(f"worker exited ({self.proc.returncode}):\n{self.output}")
            time.sleep(0.02)
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n{self.output}")

    def ready(self) -> WorkerProcess:
        self.wait_for_line(r" ready: ")
        return self

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)  # the stacks of its threads, into the output
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self._reader.join(2)
            raise AssertionError(f"worker still running after {timeout}s:\n{self.output}") from None
        self._reader.join(2)
        return code


@pytest.fixture
def spawn_worker(transactional_db: None) -> Iterator[Callable[..., WorkerProcess]]:
    spawned: list[WorkerProcess] = []
    counter = iter(range(1, 1000))

    def spawn(
        *args: str,
        worker_id: str | None = None,
        env: dict[str, str] | None = None,
        database: str | None = None,
    ) -> WorkerProcess:
        """A worker on the test database, or on ``database`` (a URL); ``env`` adds variables."""
        worker = WorkerProcess(
            list(args), worker_id or f"acceptance-{next(counter)}", env, database
        )
        spawned.append(worker)
        return worker

    yield spawn
    for worker in spawned:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGKILL)
            worker.proc.wait(10)


@contextmanager
def database_closed(admin_conn: psycopg.Connection[Any], worker_id: str) -> Iterator[None]:
    """An outage as a restart looks to a worker: every connection of ``worker_id`` dropped,
    and new ones refused until the block ends (only this test database; the server keeps
    running for others)."""
    dbname = admin_conn.info.dbname
    # A database cannot close its own doors: switch it from the maintenance database.
    server = psycopg.connect(**{**connection_kwargs(), "dbname": "postgres"}, autocommit=True)
    server.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS false')
    try:
        admin_conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name LIKE %s AND datname = current_database()",
            [f"pgq_worker:{worker_id}:%"],
        )
        yield
    finally:
        server.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS true')
        server.close()


def terminate_backends(admin_conn: object, worker_id: str, role: str) -> int:
    """pg_terminate_backend every connection of ``worker_id`` whose label ends in ``role``, in
    this test database only (another checkout's tests may run workers of the same name)."""
    rows = admin_conn.execute(  # type: ignore[attr-defined]
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = %s AND datname = current_database()",
        [f"pgq_worker:{worker_id}:{role}"[:63]],
    ).fetchall()
    return len(rows)


@pytest.fixture(scope="session")
def private_cluster() -> Iterator[PrivateCluster]:
    """A PostgreSQL server of this test session's own, migrated (tests.settings' apps), to
    restart: the shared server is never restarted."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no private PostgreSQL cluster: {reason}")
    # Not under pytest's temporary folder: as root, the server runs as ``postgres``, which
    # must reach its folder.
    root = Path(tempfile.mkdtemp(prefix="pgq-cluster-"))
    cluster = PrivateCluster(root).start()
    try:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="tests.settings",
            DATABASE_URL=cluster.url,
            PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "example_project")]),
        )
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
            cwd=REPO,
            env=env,
            check=True,
        )
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cluster_db(private_cluster: PrivateCluster) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection to the private cluster, its queue tables empty."""
    with private_cluster.connect() as conn:
        conn.execute(
            "TRUNCATE pgqueue_message, pgqueue_archive, pgqueue_dead, pgqueue_worker,"
            " pgqueue_waiting, pgqueue_dependency, pgqueue_batch_member, pgqueue_batch"
        )
        yield conn
