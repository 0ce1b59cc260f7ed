"""PostgreSQL plumbing: the bench database, and what a case cost the server.

Cost = ``pg_stat_database.xact_commit`` delta of the bench database (its own, so other
tenants do not count) and the ``pg_current_wal_lsn()`` delta (cluster-wide: other tenants
add to it, which is why the report shows the minimum over repetitions). Backends publish
their counters lazily (see measure.flush_stats).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SERVER_DSN = os.environ.get("BENCH_SERVER_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def dsn_for(server_dsn: str, dbname: str) -> str:
    return make_conninfo(server_dsn, dbname=dbname)


def scalar(conn: Any, statement: str, params: Any = None) -> Any:
    """The one value a query returns (``conn``: a connection or a cursor)."""
    row = conn.execute(statement, params).fetchone()
    assert row is not None, statement
    return row[0]


def django_database(dsn: str) -> dict[str, Any]:
    """A ``DATABASES`` entry for ``dsn`` with persistent connections."""
    params = conninfo_to_dict(dsn)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.get("dbname", "pgq_bench"),
        "USER": params.get("user", "postgres"),
        "PASSWORD": params.get("password", ""),
        "HOST": params.get("host", ""),
        "PORT": str(params.get("port", "")),
        "CONN_MAX_AGE": None,
    }


def recreate_database(server_dsn: str, dbname: str) -> None:
    with psycopg.connect(dsn_for(server_dsn, "postgres"), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [dbname],
        )
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(dbname)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))


def drop_database(server_dsn: str, dbname: str) -> None:
    with psycopg.connect(dsn_for(server_dsn, "postgres"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
        )


@contextmanager
def scratch_database(server_dsn: str, dbname: str) -> Iterator[str]:
    """A new, empty ``dbname`` on the server for the block (its DSN), dropped afterwards
    whatever happens, this process's own sessions too (``WITH (FORCE)``)."""
    recreate_database(server_dsn, dbname)
    try:
        yield dsn_for(server_dsn, dbname)
    finally:
        drop_database(server_dsn, dbname)


@dataclass(frozen=True)
class Snapshot:
    xact_commit: int
    wal_lsn: int


class StatsProbe:
    """Reads the counters through a connection to another database, so that reading them
    does not count as a transaction of the bench database."""

    def __init__(self, server_dsn: str, dbname: str) -> None:
        self.dbname = dbname
        self.conn = psycopg.connect(dsn_for(server_dsn, "postgres"), autocommit=True)

    def snapshot(self) -> Snapshot:
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute(
            "SELECT xact_commit, pg_current_wal_lsn() - '0/0'::pg_lsn "
            "FROM pg_stat_database WHERE datname = %s",
            [self.dbname],
        ).fetchone()
        assert row is not None, f"database {self.dbname} not found"
        return Snapshot(int(row[0]), int(row[1]))

    def wal_now(self) -> int:
        row = self.conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])

    def settings(self) -> dict[str, str]:
        names = (
            "server_version synchronous_commit fsync wal_level shared_buffers work_mem"
            " max_wal_size checkpoint_timeout commit_delay max_connections autovacuum"
        ).split()
        rows = self.conn.execute(
            "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)", [names]
        ).fetchall()
        out: dict[str, str] = {}
        for name, setting, unit in rows:
            if unit == "8kB":
                setting = f"{int(setting) * 8 // 1024}MB"
            elif unit in ("MB", "kB", "s", "ms", "min"):
                setting = f"{setting}{unit}"
            out[name] = setting
        return out

    def close(self) -> None:
        self.conn.close()


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """``VmRSS`` (current) or ``VmHWM`` (peak) of a process, in KiB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except FileNotFoundError:
        return 0
    return 0


def dsn_url(dsn: str) -> str:
    """The same database as a ``postgresql://`` URL (asyncpg and some peers want one)."""
    from urllib.parse import quote

    p = conninfo_to_dict(dsn)
    user = quote(str(p.get("user", "postgres")), safe="")
    password = p.get("password")
    auth = f"{user}:{quote(str(password), safe='')}@" if password else f"{user}@"
    host = str(p.get("host", "127.0.0.1"))
    port = str(p.get("port", "5432"))
    db = quote(str(p.get("dbname", "postgres")), safe="")
    if host.startswith("/"):
        return f"postgresql://{auth}/{db}?host={quote(host, safe='')}&port={port}"
    return f"postgresql://{auth}{host}:{port}/{db}"
