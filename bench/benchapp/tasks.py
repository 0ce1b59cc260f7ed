"""A no-op django.tasks task (enqueued through django-pgqueue's backend)."""

from typing import Any

from django.tasks import task


@task(queue_name="bench")
def noop_task(body: Any) -> None:
    """Does nothing."""
