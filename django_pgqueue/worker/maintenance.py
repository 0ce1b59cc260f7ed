"""The worker's maintenance thread: retention (``core/_retention.py``) every interval.

Its own thread and connection, so a long expiry never delays a claim or a completion; every
worker runs one, and the job itself makes sure one of them does the work per interval. A
failed run is logged and tried again at the next interval: maintenance never stops a worker.
"""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError, connections

from ..core import _retention
from .db import is_connection_error
from .service import Service

logger = logging.getLogger("django_pgqueue.worker")

#: Seconds after start-up before the first look (at most the interval): a worker that starts
#: does its own work first.
FIRST_DELAY = 10.0


class Maintainer(Service):
    """Retention every ``interval`` seconds (its timer), until ``stop`` is set."""

    name = "maintenance"

    def __init__(self, *, alias: str, worker_id: str, interval: float, stop: threading.Event):
        super().__init__(stop=stop)
        self.alias = alias
        self.worker_id = worker_id
        self.interval = interval
        #: Completed runs that did the work (test seam).
        self.runs = 0

    def run(self) -> None:
        delay = min(FIRST_DELAY, self.interval)
        while not self.halt.wait(delay):
            delay = self.interval
            try:
                report = _retention.maintain(worker_id=self.worker_id, using=self.alias)
                if report is not None and not report.busy:
                    self.runs += 1
            except DatabaseError as exc:
                if not is_connection_error(exc):
                    logger.exception("Retention failed; the next try is in %ss.", self.interval)
                else:
                    logger.warning(
                        "Retention skipped: the database is unreachable (%s); the next try is "
                        "in %ss.",
                        exc,
                        self.interval,
                    )
            except Exception:
                logger.exception("Retention failed; the next try is in %ss.", self.interval)
            finally:
                # Idle between runs: no connection held for minutes.
                connections.close_all()
