"""Zero-setup PostgreSQL: when no ``DATABASE_URL`` is given, start an embedded server.

Uses the ``pgserver`` wheel (``pip install 'django-pgqueue-mq[embedded]'``), which runs a real
PostgreSQL from site-packages, as root too, and keeps its data in ``data_dir``. ``pgserver``
has no wheel for Python 3.13: there the machine's own PostgreSQL binaries (``initdb`` and
``pg_ctl`` on PATH or in ``/usr/lib/postgresql/*/bin``) run the server instead, as any user
but root (PostgreSQL refuses root). The first process that asks for a folder starts its
server; every later one reuses it. The server keeps running when they exit, so the next
command starts at once; stop it with ``python -m django_pgqueue.embedded stop <data_dir>``.
``python -m django_pgqueue.embedded local`` prints the URL of a server the machine already
runs (127.0.0.1:5432 or a local socket) when one lets this user in. For development and tests
only: production points ``DATABASE_URL`` at a managed server.
"""

from __future__ import annotations

import argparse
import fcntl
import getpass
import glob
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.core.exceptions import ImproperlyConfigured


def embedded_database(
    data_dir: str | os.PathLike[str], *, name: str = "postgres"
) -> dict[str, Any]:
    """A ``DATABASES`` entry for an embedded server keeping its data in ``data_dir``: the
    ``pgserver`` wheel's, else one of the machine's PostgreSQL binaries."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (root shells, CI): harmless.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
            import pgserver
    except ImportError:  # pragma: no cover - depends on the install
        return machine_database(data_dir, name=name)
    path = Path(data_dir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    # cleanup_mode=None: the server outlives this process (the next one starts at once);
    # stop_embedded() stops it. A server already running in the folder is reused.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        server = pgserver.get_server(str(path), cleanup_mode=None)
    socket_dir = _socket_dir(server.get_uri())
    return _database_settings(name, socket_dir)


# -- the machine's PostgreSQL binaries, where pgserver has no wheel -------------------------------

#: Where distributions put the binaries when they are not on PATH (newest version first).
BINARY_DIRS = (
    "/usr/lib/postgresql/*/bin",  # Debian, Ubuntu
    "/usr/pgsql-*/bin",  # the PGDG packages of Red Hat and Fedora
    "/opt/homebrew/opt/postgresql*/bin",  # Homebrew on Apple silicon
    "/usr/local/opt/postgresql*/bin",  # Homebrew on Intel
    "/usr/local/pgsql/bin",  # built from source
)
#: A Unix socket's path is at most about 100 bytes: a longer data folder puts it in /tmp.
SOCKET_PATH_LIMIT = 100


def machine_binaries() -> Path | None:
    """The folder holding this machine's ``initdb`` and ``pg_ctl``, or None."""
    on_path = shutil.which("pg_ctl")
    if on_path and Path(on_path).with_name("initdb").exists():
        return Path(on_path).resolve().parent
    for pattern in BINARY_DIRS:
        found = sorted(glob.glob(pattern), key=_version_key, reverse=True)
        for folder in found:
            if (Path(folder) / "pg_ctl").exists() and (Path(folder) / "initdb").exists():
                return Path(folder)
    return None


def _version_key(folder: str) -> tuple[int, ...]:
    digits = "".join(c if c.isdigit() else " " for c in folder).split()
    return tuple(int(d) for d in digits)


def no_server_message(reason: str, data_dir: Path, binaries: Path | None = None) -> str:
    """What to do when no PostgreSQL can be had: the exact commands."""
    ways = []
    if sys.version_info < (3, 13):
        ways.append("pip install 'django-pgqueue-mq[embedded]' (an embedded PostgreSQL)")
    ways.append(
        "point DATABASE_URL at a server you have, e.g. "
        "export DATABASE_URL=postgres://postgres:PASSWORD@127.0.0.1:5432/postgres"
    )
    if binaries is None:
        ways.append(
            "install PostgreSQL (Debian/Ubuntu: sudo apt-get install postgresql; macOS: brew "
            "install postgresql@16) and run as a user other than root: a server is started "
            f"from its binaries in {data_dir}"
        )
    else:
        ways.append(
            f"run as a user other than root: a server is started from {binaries} in {data_dir}"
        )
    ways.append(
        "or start the installed service and let your user in: sudo service postgresql start "
        '&& sudo -u postgres createuser --superuser "$USER" (scripts/demo.sh and '
        "scripts/test.sh then find it on its socket)"
    )
    return (
        f"DATABASE_URL is not set and no PostgreSQL can be started here: {reason}. "
        "Do one of these, then run the command again:\n" + "\n".join(f"  - {w}" for w in ways)
    )


def machine_database(data_dir: str | os.PathLike[str], *, name: str = "postgres") -> dict[str, Any]:
    """A ``DATABASES`` entry for a server of the machine's binaries keeping its data in
    ``data_dir``: created and started on first use, reused after."""
    path = Path(data_dir).resolve()
    binaries = machine_binaries()
    if binaries is None:
        reason = "the embedded server (pgserver) is not installed"
        if sys.version_info >= (3, 13):
            reason = "the embedded server (pgserver) has no wheel for Python 3.13"
        raise ImproperlyConfigured(
            no_server_message(
                f"{reason}, and no PostgreSQL binaries (initdb, pg_ctl) were "
                "found on PATH or in /usr/lib/postgresql/*/bin",
                path,
            )
        )
    if os.geteuid() == 0:
        raise ImproperlyConfigured(
            no_server_message(
                f"PostgreSQL's binaries ({binaries}) refuse to run as root", path, binaries
            )
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.parent / f".{path.name}.lock"):
        socket_dir = running_socket_dir(path) or _start(binaries, path)
    return _database_settings(name, socket_dir)


@contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    """One process at a time creates or starts the server of a folder."""
    with open(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def running_socket_dir(path: Path) -> str | None:
    """The socket folder of the server running on ``path`` (postmaster.pid's fifth line)."""
    try:
        lines = (path / "postmaster.pid").read_text().splitlines()
        os.kill(int(lines[0]), 0)
    except (FileNotFoundError, IndexError, ValueError, ProcessLookupError, PermissionError):
        return None
    return lines[4] if len(lines) > 4 and lines[4] else None


def _start(binaries: Path, path: Path) -> str:
    if not (path / "PG_VERSION").exists():
        _run(
            [binaries / "initdb", "-D", path, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            "initdb",
        )
    socket_dir = path
    if len(str(path / ".s.PGSQL.5432")) > SOCKET_PATH_LIMIT:
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
        socket_dir = Path(tempfile.gettempdir()) / f"pgqueue-{digest}"
        socket_dir.mkdir(mode=0o700, exist_ok=True)
    # A Unix socket only: nothing listens on TCP, so no port clashes with a server running.
    options = f"-c listen_addresses='' -k {shlex.quote(str(socket_dir))}"
    log = path / "server.log"
    _run(
        [binaries / "pg_ctl", "-D", path, "-l", log, "-w", "-t", "60", "-o", options, "start"],
        f"pg_ctl start (its log: {log})",
    )
    return str(socket_dir)


def _run(command: list[Any], what: str) -> None:
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise ImproperlyConfigured(f"{what} failed:\n" + "\n".join(output))


# -- a server the machine runs already ----------------------------------------------------------

#: Where PostgreSQL servers of distributions put their sockets.
SOCKET_DIRS = ("/var/run/postgresql", "/run/postgresql", "/tmp")


def local_server_url(*, timeout: float = 3.0) -> str | None:
    """The URL of a PostgreSQL this machine runs that lets this user in without a password
    prompt (127.0.0.1:5432, then the usual sockets; as ``postgres``, then as the login user),
    or None."""
    import psycopg

    users = ["postgres"]
    try:
        users = list(dict.fromkeys([*users, getpass.getuser()]))
    except (KeyError, OSError):  # no name for this uid (a bare container)
        pass
    hosts = ["127.0.0.1"] + [d for d in SOCKET_DIRS if Path(d, ".s.PGSQL.5432").exists()]
    for host in hosts:
        for user in users:
            try:
                with psycopg.connect(
                    host=host,
                    port=5432,
                    user=user,
                    dbname="postgres",
                    connect_timeout=max(1, int(timeout)),
                ):
                    pass
            except psycopg.Error:
                continue
            if host == "127.0.0.1":
                return f"postgres://{user}@127.0.0.1:5432/postgres"
            return f"postgres://{user}@/postgres?host={quote(host)}"
    return None


def _socket_dir(uri: str) -> str:
    # pgserver's URIs look like postgresql://postgres:@/postgres?host=/path/to/socket/dir
    from urllib.parse import parse_qs, urlparse

    host = parse_qs(urlparse(uri).query).get("host", [""])[0]
    if not host:
        raise ImproperlyConfigured(f"Unexpected embedded PostgreSQL URI: {uri}")
    return host


def database_from_environment(
    default_data_dir: str | os.PathLike[str], *, env: Any = None
) -> dict[str, Any]:
    """``DATABASE_URL`` parsed by django-environ when set, else the embedded server."""
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        import environ

        config: dict[str, Any] = (env or environ.Env()).db_url_config(url)
        return config
    return embedded_database(os.environ.get("PGQUEUE_EMBEDDED_DIR", default_data_dir))


def stop_embedded(data_dir: str | os.PathLike[str], *, timeout: float = 30.0) -> bool:
    """Stop the embedded server keeping its data in ``data_dir``; ``False`` if none runs.

    A "fast" shutdown (SIGINT to the postmaster): open sessions end, the data is checkpointed.
    """
    pid_file = Path(data_dir).resolve() / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, signal.SIGINT)
    except (FileNotFoundError, IndexError, ValueError, ProcessLookupError):
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    raise TimeoutError(f"the embedded PostgreSQL (pid {pid}) did not stop in {timeout:.0f}s")


def _database_settings(name: str, socket_dir: str) -> dict[str, str]:
    """Django's ``DATABASES`` entry for database ``name`` of a server listening in ``socket_dir``."""
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": socket_dir,
        "PORT": "",
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m django_pgqueue.embedded {url,stop,local} [DATA_DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m django_pgqueue.embedded",
        description="Start (url) or stop the embedded PostgreSQL keeping its data in DATA_DIR; "
        "local: print the URL of a PostgreSQL this machine runs (exit 1 if none lets us in).",
    )
    parser.add_argument("command", choices=["url", "stop", "local"])
    parser.add_argument("data_dir", nargs="?", default=".pgdata")
    args = parser.parse_args(argv)
    if args.command == "stop":
        stopped = stop_embedded(args.data_dir)
        print(f"stopped the PostgreSQL in {args.data_dir}" if stopped else "none was running")
        return 0
    if args.command == "local":
        url = local_server_url()
        if url is None:
            return 1
        print(url)
        return 0
    try:
        config = embedded_database(args.data_dir)
    except ImproperlyConfigured as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"postgresql://{config['USER']}@/{config['NAME']}?host={config['HOST']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
