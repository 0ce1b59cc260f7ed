"""The demo's django.tasks: enqueued with ``.enqueue()``, run by the same ``pgq_worker``."""

from __future__ import annotations

from typing import Any

from django_pgqueue.tasks import task
from django_pgqueue.tasks.framework import TaskContext

from .models import Signup


@task(takes_context=True, max_attempts=3, backoff=1.0)
def signup_digest(context: TaskContext[Any, Any], note: str = "") -> dict[str, Any]:
    """Count signups and welcomes (read-only, so safe to run twice)."""
    return {
        "signups": Signup.objects.count(),
        "welcomed": Signup.objects.filter(welcomed_at__isnull=False).count(),
        "note": note,
        "attempt": context.attempt,
    }
