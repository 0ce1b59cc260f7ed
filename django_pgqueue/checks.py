"""System checks with stable ids. Each id is documented in docs/reference/checks.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.db import DatabaseError, connections

from .conf import get_settings, settings_problems
from .core import _partitions

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


@checks.register(checks.Tags.database)
def check_partition_privileges(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """W001: the workers run retention, but their role cannot create the archive's days.

    A database check: it runs with ``manage.py check --database <alias>`` (and ``migrate``),
    connected as that alias's role."""
    alias = _queue_alias()
    if alias not in (databases or ()) or settings_problems(getattr(settings, "PGQUEUE", None)):
        return []
    if get_settings().RETENTION_INTERVAL is None:
        return []
    try:
        with connections[alias].cursor() as cursor:
            missing = _partitions.missing_ddl_privilege(cursor)
    except DatabaseError:
        return []  # Unreachable or not migrated: other checks and commands say so.
    if missing is None:
        return []
    return [
        checks.Warning(
            f"Retention runs in the workers (RETENTION_INTERVAL), but {missing}: the workers "
            "cannot create the archive's day partitions ahead nor drop expired days.",
            hint="Run `manage.py pgq_prune --partitions-only` daily as the owner role, or run "
            "the workers as the owner; see how-to/database-roles in the docs.",
            id="django_pgqueue.W001",
        )
    ]


def _queue_alias() -> str:
    raw = getattr(settings, "PGQUEUE", None) or {}
    alias = raw.get("DATABASE_ALIAS", "default") if isinstance(raw, dict) else "default"
    return alias if isinstance(alias, str) else "default"
