"""Zero-setup PostgreSQL: when no ``DATABASE_URL`` is given, start an embedded server.

Uses the ``pgserver`` wheel (``pip install 'django-pgqueue-mq[embedded]'``), which runs a real
PostgreSQL from site-packages, as root too, and keeps its data in ``data_dir``. The first
process that asks for a folder starts its server; every later one reuses it. The server keeps
running when they exit, so the next command starts at once; stop it with
``python -m django_pgqueue.embedded stop <data_dir>``. For development and tests only:
production points ``DATABASE_URL`` at a managed server.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured


def embedded_database(
    data_dir: str | os.PathLike[str], *, name: str = "postgres"
) -> dict[str, Any]:
    """A ``DATABASES`` entry for an embedded server keeping its data in ``data_dir``."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (root shells, CI): harmless.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
            import pgserver
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImproperlyConfigured(
            "DATABASE_URL is not set and the embedded PostgreSQL is not installed: "
            "pip install 'django-pgqueue-mq[embedded]', or set DATABASE_URL "
            "(e.g. postgres://postgres@127.0.0.1:5432/postgres)."
        ) from exc
    path = Path(data_dir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    # cleanup_mode=None: the server outlives this process (the next one starts at once);
    # stop_embedded() stops it. A server already running in the folder is reused.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        server = pgserver.get_server(str(path), cleanup_mode=None)
    socket_dir = _socket_dir(server.get_uri())
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": socket_dir,
        "PORT": "",
    }


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


def main(argv: list[str] | None = None) -> int:
    """``python -m django_pgqueue.embedded {url,stop} [DATA_DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m django_pgqueue.embedded",
        description="Start (url) or stop the embedded PostgreSQL keeping its data in DATA_DIR.",
    )
    parser.add_argument("command", choices=["url", "stop"])
    parser.add_argument("data_dir", nargs="?", default=".pgdata")
    args = parser.parse_args(argv)
    if args.command == "stop":
        stopped = stop_embedded(args.data_dir)
        print(f"stopped the PostgreSQL in {args.data_dir}" if stopped else "none was running")
        return 0
    config = embedded_database(args.data_dir)
    print(f"postgresql://{config['USER']}@/{config['NAME']}?host={config['HOST']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
