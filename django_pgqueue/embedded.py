"""Zero-setup PostgreSQL: when no ``DATABASE_URL`` is given, start an embedded server.

Uses the ``pgserver`` wheel (``pip install django-pgqueue[embedded]``), which runs a real
PostgreSQL from site-packages, as root too, and keeps its data in ``data_dir``. The server is
shared by every process that asks for the same folder and stops when the last one exits.
For development and tests only: production points ``DATABASE_URL`` at a managed server.
"""

from __future__ import annotations

import os
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
            "pip install 'django-pgqueue[embedded]', or set DATABASE_URL "
            "(e.g. postgres://postgres@127.0.0.1:5432/postgres)."
        ) from exc
    path = Path(data_dir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    # cleanup_mode=None: leave the server running for the next process (fast restarts); a
    # stale server in the folder is reused.
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
