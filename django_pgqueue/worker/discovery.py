"""Import every installed app's ``handlers`` and ``tasks`` modules so their handlers register.

Like ``django.contrib.admin.autodiscover()``: an app that has no such module is skipped; an
app whose module fails to import stops the worker with that error (a worker that silently
lacks a handler would dead-letter its messages as ``rejected``).
"""

from __future__ import annotations

from importlib import import_module

from django.apps import apps
from django.utils.module_loading import module_has_submodule

from ..core._registry import registry

#: Module names looked up in every installed app.
HANDLER_MODULES = ("handlers", "tasks")


def autodiscover() -> list[str]:
    """Import the handler modules of all installed apps; return the registered task names."""
    for module_name in HANDLER_MODULES:
        for app_config in apps.get_app_configs():
            # django_pgqueue's own ``tasks`` is the Tasks backend, not a module of tasks: it
            # needs a Tasks framework, which the worker does not (Django 5.2 has none).
            if app_config.name == "django_pgqueue":
                continue
            if module_has_submodule(app_config.module, module_name):
                import_module(f"{app_config.name}.{module_name}")
    return registry.names()
