"""A PostgreSQL server of a test's own, to restart and crash: never the shared server.

``initdb`` into a temporary folder, a free port on 127.0.0.1, trust authentication; the
server's binaries are the machine's (``pg_config --bindir``, else Debian's
``/usr/lib/postgresql/<version>/bin``). As root, every command runs as the ``postgres`` user
(``initdb`` refuses root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path

import psycopg


def _bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = Path(subprocess.check_output([pg_config, "--bindir"], text=True).strip())
        if (found / "initdb").exists():
            return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    return versions[0].parent if versions else None


def unavailable_reason() -> str | None:
    """Why a private cluster cannot be started here, or None."""
    if _bindir() is None:
        return "no PostgreSQL server binaries (initdb) on this machine"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a 'postgres' user to run initdb as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    def __init__(self, root: Path) -> None:
        bindir = _bindir()
        assert bindir is not None, unavailable_reason()
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.port = _free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        self._as: list[str] = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]
            shutil.chown(root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{root}'\nfsync = off\n"
                "max_connections = 100\n"
            )

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self._as, str(self.bindir / tool), *args],
            check=True,
            capture_output=True,
            text=True,
        )

    def _ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", *args)

    def start(self) -> PrivateCluster:
        self._ctl("start")
        return self

    def restart(self, mode: str = "fast") -> None:
        """Every connection is dropped; the server refuses new ones until it is back."""
        self._ctl("-m", mode, "restart")

    def stop(self) -> None:
        self._ctl("-m", "immediate", "stop")

    def connect(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url, autocommit=True)
