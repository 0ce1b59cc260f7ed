"""The handler registry's former location; it lives in :mod:`django_pgqueue.core._registry`."""

from ..core._registry import Handler, HandlerRegistry, handler, notify_dead, registry

__all__ = ["Handler", "HandlerRegistry", "handler", "notify_dead", "registry"]
