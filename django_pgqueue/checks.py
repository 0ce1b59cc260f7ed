"""System checks with stable ids. Each id is documented in docs/reference/checks.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks

from .conf import settings_problems

POSTGRES_ENGINES = ("django.db.backends.postgresql",)


@checks.register(checks.Tags.compatibility)
def check_database_engine(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E001: the queue's database must be PostgreSQL."""
    alias = _queue_alias()
    databases = getattr(settings, "DATABASES", {})
    if alias not in databases:
        return [
            checks.Error(
                f"PGQUEUE['DATABASE_ALIAS'] is {alias!r}, which is not in DATABASES.",
                hint="Set PGQUEUE['DATABASE_ALIAS'] to one of: " + ", ".join(databases),
                id="django_pgqueue.E005",
            )
        ]
    engine = databases[alias].get("ENGINE", "")
    if not engine.startswith(POSTGRES_ENGINES):
        return [
            checks.Error(
                f"django-pgqueue needs PostgreSQL, but DATABASES[{alias!r}] uses {engine!r}.",
                hint="Use ENGINE 'django.db.backends.postgresql' (psycopg 3).",
                id="django_pgqueue.E001",
            )
        ]
    return []


@checks.register()
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E002 unknown key, E003 bad value, E004 bad queue name in PGQUEUE."""
    return [
        checks.Error(str(problem), id=f"django_pgqueue.{problem.check_id}")
        for problem in settings_problems(getattr(settings, "PGQUEUE", None))
    ]


def _queue_alias() -> str:
    raw = getattr(settings, "PGQUEUE", None) or {}
    alias = raw.get("DATABASE_ALIAS", "default") if isinstance(raw, dict) else "default"
    return alias if isinstance(alias, str) else "default"
