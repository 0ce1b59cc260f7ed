"""Import every installed app's ``handlers`` and ``tasks`` modules so their handlers register.

Like ``django.contrib.admin.autodiscover()``: an app that has no such module is skipped; an
app whose module fails to import stops the worker with that error (a worker that silently
lacks a handler would dead-letter its messages as ``rejected``).
"""

from __future__ import annotations

from django.utils.module_loading import autodiscover_modules

from .registry import registry

#: Module names looked up in every installed app.
HANDLER_MODULES = ("handlers", "tasks")


def autodiscover() -> list[str]:
    """Import the handler modules of all installed apps; return the registered task names."""
    autodiscover_modules(*HANDLER_MODULES)
    return registry.names()
