"""Which Tasks framework this Django has: ``django.tasks`` (Django 6.0+), the ``django-tasks``
backport (``django_tasks``, the same API) on Django 5.2, or none.

Nothing here imports the framework, so it is safe from settings modules: the queue, the
worker and the admin work without one; only ``django_pgqueue.tasks`` needs it.
"""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec

__all__ = ["TASKS_FRAMEWORK", "import_tasks_framework_checks", "tasks_framework_missing"]


def _tasks_framework() -> str | None:
    # Django's own wins when both are installed: django-tasks is its backport.
    for name in ("django.tasks", "django_tasks"):
        if find_spec(name) is not None:
            return name
    return None


#: The importable name of the Tasks framework, or ``None`` (Django 5.2 without the backport).
TASKS_FRAMEWORK: str | None = _tasks_framework()


def tasks_framework_missing() -> ImportError:
    """The error for using the Tasks backend where there is no Tasks framework."""
    return ImportError(
        "django_pgqueue.tasks needs Django's Tasks framework: Django 6.0 or newer, or on "
        "Django 5.2 the django-tasks backport (pip install 'django-pgqueue-mq[tasks]'). "
        "The queue, the worker and the admin work without it."
    )


def import_tasks_framework_checks() -> None:
    """Register the Tasks framework's system checks and log receivers, if there is one.

    ``django.tasks`` does it when imported; the backport does it in its own ``AppConfig``,
    which then need not be in ``INSTALLED_APPS``.
    """
    if TASKS_FRAMEWORK is not None:
        import_module(f"{TASKS_FRAMEWORK}.checks")
        import_module(f"{TASKS_FRAMEWORK}.signals")
