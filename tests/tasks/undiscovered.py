"""A task in a module no worker imports (not an app's ``tasks`` or ``handlers`` module)."""

from __future__ import annotations

from django_pgqueue.tasks import task


@task
def never_registered_in_the_worker() -> None:
    """The worker rejects its messages: it only runs tasks registered in its own process."""
