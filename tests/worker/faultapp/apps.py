"""The fault-injection seam of the supervision tests (installed by ``fault_settings`` only).

``PGQ_FAULT`` names a worker thread; once the file ``PGQ_FAULT_TRIGGER`` exists, one
function only that thread runs raises, as a bug there would. A test makes the worker busy or
idle first, then creates the file.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.apps import AppConfig

#: Thread -> (module, owner in it or "", function): what raises in that thread.
FAULTS = {
    "main loop": ("django_pgqueue.worker.fetcher", "Fetcher", "refresh_queues"),
    "completer": ("django_pgqueue.worker.completer", "Completer", "flush"),
    "heartbeat": ("django_pgqueue.worker.heartbeat", "", "beat"),
    "listener": ("django_pgqueue.worker.notifications", "Notifications", "on_notify"),
    "handler thread": ("django_pgqueue.worker.executor", "Executor", "start_job"),
    "async loop": ("django_pgqueue.worker.async_handlers", "AsyncHandlers", "_start_task"),
}


def inject(thread: str, trigger: Path) -> None:
    module_name, owner_name, name = FAULTS[thread]
    module = importlib.import_module(module_name)
    owner: Any = getattr(module, owner_name) if owner_name else module
    original: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(original)
    def faulty(*args: Any, **kwargs: Any) -> Any:
        if trigger.exists():
            raise RuntimeError(f"injected fault in the {thread}")
        return original(*args, **kwargs)

    setattr(owner, name, faulty)


class FaultAppConfig(AppConfig):
    name = "tests.worker.faultapp"
    label = "faultapp"

    def ready(self) -> None:
        thread = os.environ.get("PGQ_FAULT")
        if thread:
            inject(thread, Path(os.environ["PGQ_FAULT_TRIGGER"]))
