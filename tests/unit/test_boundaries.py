"""The package's boundaries: one exception tree, no import cycles between modules.

The import contracts themselves (the core below the worker, Tasks backend and admin; nothing
but the commands importing the pipeline) are `lint-imports` contracts in pyproject.toml.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import django_pgqueue
from django_pgqueue.exceptions import PgQueueError

# Imported only with the extras that provide what they import.
OPTIONAL = ("django_pgqueue.tasks", "django_pgqueue.pipeline")


def package_modules() -> list[str]:
    names = [django_pgqueue.__name__]
    for info in pkgutil.walk_packages(django_pgqueue.__path__, prefix="django_pgqueue."):
        if ".migrations" not in info.name and not info.name.endswith("__main__"):
            names.append(info.name)
    return sorted(names)


def test_every_exception_the_package_defines_is_a_pgqueue_error():
    outside = []
    for name in package_modules():
        try:
            module = importlib.import_module(name)
        except ImportError:
            if name.startswith(OPTIONAL):
                continue
            raise
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, BaseException):
                if not issubclass(cls, PgQueueError):
                    outside.append(f"{name}.{cls.__qualname__}")
    assert outside == [], outside


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
