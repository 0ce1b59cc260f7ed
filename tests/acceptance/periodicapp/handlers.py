"""A schedule every 2 seconds, for the worker processes of test_periodic_workers.py."""

from __future__ import annotations

from typing import Any

import django_pgqueue


@django_pgqueue.periodic(every=2, queue="periodic-accept")
@django_pgqueue.handler("tests.periodic-tick")
def tick(payload: Any) -> Any:
    return payload
