"""The two shapes of a worker's moving parts: a :class:`Service` runs in a thread of its own,
a :class:`Chore` is a small timed job that a service's thread runs when it falls due.

Each owns its state and its timer, so a reader finds a timer by the name of what it times.
The worker (``runner.py``) composes them: it starts the services, stops them, and asks each
whether it is alive; an unexpected error escaping a service's thread is reported to the worker
(``on_crash``), which then stops, never running on with a part missing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import connections

logger = logging.getLogger("django_pgqueue.worker")

#: Told which part failed and how: the worker stops and exits 1.
OnCrash = Callable[[str, BaseException], None]


class Service:
    """A part of the worker with a thread of its own: :meth:`start`, :meth:`stop`,
    :meth:`is_alive` (its health), :meth:`join`.

    The thread runs :meth:`run` until it returns; :meth:`run` watches ``self.halt``, which
    :meth:`stop` sets (several services may share one event: the worker's stop). The thread's
    Django connections are closed when it ends.
    """

    #: The thread's name (also the ``application_name`` suffix of its connection).
    name = "service"

    def __init__(
        self, *, stop: threading.Event | None = None, on_crash: OnCrash | None = None
    ) -> None:
        self.halt = stop if stop is not None else threading.Event()
        self.on_crash = on_crash
        #: What the thread is doing, named in the report of an error there.
        self.doing = self.name
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.halt.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def started(self) -> bool:
        return self._thread is not None

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> None:
        raise NotImplementedError

    def _main(self) -> None:
        try:
            self.run()
        except BaseException as exc:
            if self.on_crash is None:
                logger.error("Internal error in the %s thread.", self.doing, exc_info=exc)
            else:
                self.on_crash(self.doing, exc)
        finally:
            connections.close_all()  # this thread's own


class Chore:
    """A timed job a service's thread runs when due (:meth:`run_if_due`); ``next_at`` is its
    timer (monotonic seconds), which the host thread sleeps towards."""

    #: Seconds between runs.
    interval: float

    def __init__(self, interval: float, *, first: float | None = None) -> None:
        self.interval = interval
        self.next_at = time.monotonic() + (interval if first is None else first)

    def retime(self, interval: float) -> None:
        """Run every ``interval`` seconds from now on."""
        self.interval = interval
        self.next_at = time.monotonic() + interval

    def run_if_due(self, now: float) -> None:
        if now < self.next_at:
            return
        delay = self.run()
        if delay is None:
            self.next_at = now + self.interval
        else:
            self.next_at = time.monotonic() + delay

    def run(self) -> float | None:
        """Do the job; return the seconds until the next run, or None for ``interval``."""
        raise NotImplementedError
