"""A PostgreSQL cluster of the bench's own, with the server's default settings (autovacuum
on), started for one run and removed at its end, Ctrl-C included.

The machine's shared server is tuned for tests (its ``conf.d`` turns autovacuum off), which
hides exactly what the MVCC scenarios measure. Debian's ``pg_createcluster`` makes a new
cluster from the packaged defaults; the settings added are ``pg_stat_statements`` in
``shared_preload_libraries``, to read each claim statement's buffer use, and
``log_autovacuum_min_duration = 0``, which only logs every autovacuum run (checkpoints are
logged by default), so latency stalls can be set against them. It takes root (or the
``postgres`` user) to make a cluster; its server runs as ``postgres``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import psycopg

STATEMENTS_EXTENSION = "pg_stat_statements"


def unavailable_reason() -> str | None:
    """Why a private cluster cannot be made on this machine, or None."""
    if shutil.which("pg_createcluster") is None:
        return "no pg_createcluster (Debian's postgresql-common) on this machine"
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != "postgres":
        return "making a cluster with pg_createcluster takes root or the postgres user"
    if not _versions():
        return "no PostgreSQL server installed under /usr/lib/postgresql"
    return None


def _versions() -> list[str]:
    found = Path("/usr/lib/postgresql").glob("*/bin/postgres")
    return sorted((p.parent.parent.name for p in found), key=int)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (and SIGHUP) unwind like Ctrl-C, so the cluster is removed on the way out."""
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def private_server(
    name: str, keep_log: Path | None = None, settings: Sequence[str] = ()
) -> Iterator[str]:
    """A started cluster ``name`` on a free port of 127.0.0.1; yields its server DSN (the
    ``postgres`` database, user postgres, trust). ``settings`` (``NAME=VALUE``) are set on it
    besides the defaults. The cluster and its data are dropped when the block ends, however
    it ends; its server log is copied to ``keep_log`` first."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    version = _versions()[-1]
    port = _free_port()
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        preload = f"shared_preload_libraries={STATEMENTS_EXTENSION}"
        options = [preload, "log_autovacuum_min_duration=0", *settings]
        command = ["pg_createcluster", version, name, "--port", str(port), "--start"]
        command += [word for option in options for word in ("-o", option)]
        subprocess.run([*command, "--", "--auth=trust"], check=True, capture_output=True, text=True)
        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE EXTENSION IF NOT EXISTS {STATEMENTS_EXTENSION}")
        yield dsn
    finally:
        if keep_log is not None:
            _copy_log(version, name, keep_log)
        # Also after a failed start: pg_createcluster may have made it before it failed.
        subprocess.run(
            ["pg_dropcluster", "--stop", version, name], check=False, capture_output=True
        )
        for s, handler in previous.items():
            signal.signal(s, handler)


def _copy_log(version: str, name: str, target: Path) -> None:
    log = Path(f"/var/log/postgresql/postgresql-{version}-{name}.log")
    if log.exists():
        shutil.copyfile(log, target)


def enable_statements(dsn: str) -> None:
    """``pg_stat_statements`` in a database of the private cluster (views are per database)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE EXTENSION IF NOT EXISTS {STATEMENTS_EXTENSION}")
