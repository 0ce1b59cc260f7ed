"""A task in an installed app's module that nothing imports at startup: reading one of its
results imports it (an installed app's module may be imported; see tasks/results.py)."""

from __future__ import annotations

from django_pgqueue.tasks import task


@task
def imported_on_demand(x: int) -> int:
    return x
