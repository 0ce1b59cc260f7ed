"""The package's boundaries: one exception tree, no import cycles between modules.

The import contracts themselves (the core below the worker, Tasks backend and admin; nothing
but the commands importing the pipeline) are `lint-imports` contracts in pyproject.toml.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

import django_pgqueue
from django_pgqueue.exceptions import PgQueueError

REPO = Path(__file__).resolve().parents[2]

# Imported only with the extras that provide what they import (the metrics' exposition says
# which extra it needs with ImproperlyConfigured).
OPTIONAL = ("django_pgqueue.tasks", "django_pgqueue.pipeline", "django_pgqueue.metrics")


def package_modules() -> list[str]:
    names = [django_pgqueue.__name__]
    for info in pkgutil.walk_packages(django_pgqueue.__path__, prefix="django_pgqueue."):
        if ".migrations" not in info.name and not info.name.endswith("__main__"):
            names.append(info.name)
    return sorted(names)


def defined_exceptions() -> list[type[BaseException]]:
    """Every exception class a module of the package defines (optional extras installed)."""
    found = []
    for name in package_modules():
        try:
            module = importlib.import_module(name)
        except (ImportError, ImproperlyConfigured):
            if name.startswith(OPTIONAL):
                continue
            raise
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, BaseException):
                found.append(cls)
    return found


def test_every_exception_the_package_defines_is_a_pgqueue_error():
    outside = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in defined_exceptions()
        if not issubclass(cls, PgQueueError)
    ]
    assert outside == [], outside


# The Tasks framework's InvalidTask is optional: the exception module imports without it.
DEFINED_ELSEWHERE = {"django_pgqueue.tasks.backend.InvalidTaskMessage"}


def test_every_public_exception_is_defined_in_the_exception_module():
    elsewhere = {
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in defined_exceptions()
        if cls.__module__ != "django_pgqueue.exceptions" and not cls.__qualname__.startswith("_")
    }
    assert elsewhere <= DEFINED_ELSEWHERE, elsewhere - DEFINED_ELSEWHERE


def test_no_module_imports_itself_through_others():
    """Counted over every import that runs (``if TYPE_CHECKING:`` blocks excluded)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("django_pgqueue", exclude_type_checking_imports=True)
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            path = graph.find_shortest_chain(importer=imported, imported=module)
            if path:
                cycles.append(" -> ".join((module, *path)))
    assert cycles == []


def test_importing_the_package_loads_no_models():
    """Settings modules and ``INSTALLED_APPS`` import it before Django's apps are ready."""
    code = (
        "import sys, django_pgqueue; "
        "loaded = [m for m in sys.modules if m.startswith('django_pgqueue.')]; "
        "assert 'django_pgqueue.models' not in loaded, loaded; "
        "assert not any(m.startswith(('django_pgqueue.worker', 'django_pgqueue.admin')) "
        "for m in loaded), loaded"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_the_facade_names_what_it_promises():
    for name in django_pgqueue.__all__:
        assert getattr(django_pgqueue, name) is not None, name
    assert callable(django_pgqueue.periodic)
    assert django_pgqueue.lease == django_pgqueue.models.Message.objects.lease
    with pytest.raises(AttributeError):
        django_pgqueue.no_such_name  # noqa: B018
