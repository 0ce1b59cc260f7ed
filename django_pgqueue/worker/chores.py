"""The timed chores of the worker's main thread, each with its own timer: the periodic
schedules, the status line, the listener probe and the stale-ready warning.

The main loop (``fetcher.py``) runs each when it falls due, between claims, and sleeps
towards the earliest; none holds a connection or a thread of its own.
"""

from __future__ import annotations

import logging
import threading
import uuid

from django.db import connections

from ..core import _sql
from ..periodic import Ticker
from . import sql as worker_sql
from .db import retrying
from .executor import Executor
from .heartbeat import Stats
from .listener import PROBE_PREFIX, Listener
from .service import Chore

logger = logging.getLogger("django_pgqueue.worker")

#: Seconds between status lines (processed/s, in flight, retries, dead).
STATUS_INTERVAL = 30.0
#: Seconds between listener probes; a probe not heard by the next one means a deaf listener.
PROBE_INTERVAL = 15.0
#: The longest pause between two looks for ready messages that wait too long.
STALE_CHECK_MAX = 60.0


class PeriodicSchedules(Chore):
    """Enqueues the periodic schedules' due slots (``periodic.py``) when the next one is due."""

    def __init__(self, alias: str) -> None:
        self.ticker = Ticker(alias)
        super().__init__(self.ticker.check_interval, first=0.0)

    def __bool__(self) -> bool:
        return bool(self.ticker)  # no schedules: nothing to time

    def run(self) -> float:
        return self.ticker.run_due()


class StatusLine(Chore):
    """Logs processed/s (over its own window), in flight and the totals every 30 s."""

    def __init__(self, worker_id: str, stats: Stats, executor: Executor) -> None:
        super().__init__(STATUS_INTERVAL)
        self.worker_id = worker_id
        self.stats = stats
        self.executor = executor
        # Its own window: the heartbeat's look must not reset it.
        self._rate = stats.rate_window()

    def run(self) -> None:
        s = self.stats
        logger.info(
            "pgq_worker %s: %.1f processed/s, %d in flight, %d processed, %d retried, %d dead.",
            self.worker_id,
            self._rate.rate(),
            self.executor.in_flight(),
            s.processed,
            s.retried,
            s.dead,
        )


class ListenerProbe(Chore):
    """Sends the worker's listener a private notification every 15 s; when the previous one
    was not heard, the listener reconnects (it was deaf)."""

    def __init__(
        self, *, alias: str, channel: str, worker_id: str, listener: Listener, stop: threading.Event
    ) -> None:
        super().__init__(PROBE_INTERVAL)
        self.alias = alias
        self.channel = channel
        self.listener = listener
        self.stop = stop
        # Probes of this run only: other workers' probes (and a restarted worker's under the
        # same id) arrive on the same channel.
        self.mine = f"{PROBE_PREFIX}{worker_id} {uuid.uuid4().hex[:12]} "
        self._sent: str | None = None
        self._heard: str | None = None
        self._seq = 0

    def heard(self, payload: str) -> None:
        """The listener's ``on_probe``: a probe arrived (perhaps another worker's)."""
        if payload.startswith(self.mine):
            self._heard = payload

    def run(self) -> None:
        if self._sent is not None and self._heard != self._sent:
            self.listener.reconnect()
        self._seq += 1
        payload = f"{self.mine}{self._seq}"

        def send() -> None:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(worker_sql.PROBE, [self.channel, payload])

        retrying("probing the listener", send, alias=self.alias, abort=self.stop)
        self._sent = payload


class StaleReadyWarning(Chore):
    """Warns about queues whose ready messages waited longer than ``threshold`` seconds."""

    def __init__(self, *, alias: str, threshold: float, stop: threading.Event) -> None:
        super().__init__(min(threshold, STALE_CHECK_MAX))
        self.alias = alias
        self.threshold = threshold
        self.stop = stop

    def run(self) -> None:
        def query() -> list[tuple[str, float]]:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(_sql.LIVE_QUEUES)
                queues = [row[0] for row in cursor.fetchall()]
                if not queues:
                    return []
                cursor.execute(worker_sql.STALE_READY, [queues, float(self.threshold)])
                return [(row[0], row[1]) for row in cursor.fetchall()]

        for queue, age in retrying(
            "checking waiting messages", query, alias=self.alias, abort=self.stop
        ):
            logger.warning(
                "Ready messages on queue %r have waited %.0fs (threshold %ss): no worker is "
                "taking them fast enough, or none serves this queue.",
                queue,
                age,
                self.threshold,
            )
