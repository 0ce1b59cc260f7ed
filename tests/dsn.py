"""The test database as a ``DATABASE_URL``, for the subprocesses tests start (workers, jobs)."""

from __future__ import annotations

from urllib.parse import quote

from django.db import connection


def database_url() -> str:
    """A DATABASE_URL naming the database this test runs on (the test database)."""
    s = connection.settings_dict
    user = quote(s.get("USER") or "", safe="")
    password = quote(s.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else f"{user}@" if user else ""
    host = quote(s.get("HOST") or "", safe="")
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{s['NAME']}"
