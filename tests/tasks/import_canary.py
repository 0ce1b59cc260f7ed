"""A module outside every installed app: a task path read from a row must never import it."""

from __future__ import annotations

from django_pgqueue.tasks import task


@task
def looks_like_a_task() -> None:
    """A real task, so only the import rule (not the Task check) keeps the module out."""
