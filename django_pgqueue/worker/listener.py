"""The LISTEN connection: the listener thread's own Django connection, whose NOTIFYs wake
the worker.

NOTIFY is only a hint: the listener hands the queue name to ``on_notify``, which may claim
on this very connection (an idle worker does, sparing the main loop's wake-up and one
thread hand-off) or just wake the main loop. When the connection drops the
thread reconnects with capped backoff, LISTENs again and asks for one catch-up fetch
(notifications sent meanwhile are lost). A private probe payload, sent now and then by the
worker on its query connection, proves the listener still hears; a probe that never arrives
makes the worker call :meth:`Listener.reconnect`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

import psycopg
from django.db import DatabaseError, connections

from ..core._notify import listen_statement
from . import sql
from .db import backoff_schedule, close_connection, first_line
from .service import OnCrash, Service

logger = logging.getLogger("django_pgqueue.worker")

#: Payloads starting with this are the worker's own probes; no queue name can start so.
PROBE_PREFIX = "~probe "

# How long one wait for notifications lasts before the thread checks whether to stop.
POLL_SLICE = 0.25
# Deferred work (:meth:`Listener.defer`) runs once no notification came for this long, or
# after DEFER_MAX at the latest.
QUIET_SLICE = 0.005
DEFER_MAX = 0.05

#: What a lost LISTEN connection raises: the driver's errors while waiting for
#: notifications, Django's while (re)connecting or claiming through ``on_notify``.
LOST = (psycopg.Error, DatabaseError)


class Listener(Service):
    """LISTENs on ``channel`` and calls ``on_notify(queue)`` for each notification.

    ``on_notify`` runs in this thread, outside the driver's wait for notifications, so it may
    query through ``connections[alias]``: in this thread, that is the LISTEN connection.
    """

    name = "listener"
    _deferred: dict[Hashable, Callable[[], None]]
    _deferred_since = 0.0

    def __init__(
        self,
        *,
        alias: str,
        channel: str,
        application_name: str,
        on_notify: Callable[[str], None],
        on_reconnect: Callable[[], None],
        on_probe: Callable[[str], None],
        on_crash: OnCrash | None = None,
    ) -> None:
        # Its own stop: it stops first when the worker shuts down (see shutdown.py).
        super().__init__(on_crash=on_crash)
        self.alias = alias
        self.application_name = application_name[:63]
        self.channel = channel
        self.on_notify = on_notify
        self.on_reconnect = on_reconnect
        self.on_probe = on_probe
        self.on_crash = on_crash
        self.ready = threading.Event()
        #: True while the connection is up and LISTENing (read by the readiness probe).
        self.connected = False
        self._reset = threading.Event()
        self._deferred = {}

    def defer(self, key: Hashable, work: Callable[[], None]) -> None:
        """From ``on_notify`` (this thread only): run ``work`` once the connection is quiet,
        so it does not compete with the handler that was just started. A second ``work``
        under the same key replaces the first."""
        if not self._deferred:
            self._deferred_since = time.monotonic()
        self._deferred[key] = work

    def reconnect(self) -> None:
        """Drop the connection and listen again (the probe found it deaf)."""
        self._reset.set()

    def run(self) -> None:
        # A lost connection reconnects; anything else escaping is an internal error (the
        # worker stops: deaf to wake-ups, it would only look alive).
        try:
            self._serve()
        finally:
            close_connection(self.alias)

    def _serve(self) -> None:
        next_delay: Callable[[], float] | None = None
        outage_started = 0.0
        first = True
        while not self.halt.is_set():
            try:
                conn = self._connect()
            except LOST as exc:
                close_connection(self.alias)
                if next_delay is None:
                    next_delay = backoff_schedule()
                    outage_started = time.monotonic()
                    logger.warning(
                        "LISTEN connection failed (%s); retrying with backoff.", first_line(exc)
                    )
                self.halt.wait(next_delay())
                continue
            try:
                if next_delay is not None:
                    logger.info(
                        "LISTEN connection back after %.1fs; catching up.",
                        time.monotonic() - outage_started,
                    )
                next_delay = None
                if not first:
                    self.on_reconnect()
                first = False
                self.ready.set()
                self.connected = True
                self._listen(conn)
            except LOST as exc:
                self.connected = False
                if self.halt.is_set():
                    break
                if next_delay is None:
                    next_delay = backoff_schedule()
                    outage_started = time.monotonic()
                    logger.warning("LISTEN connection lost (%s); reconnecting.", first_line(exc))
                self.halt.wait(next_delay())
            finally:
                self.connected = False
                close_connection(self.alias)

    def _connect(self) -> psycopg.Connection[Any]:
        """This thread's Django connection, fresh, labelled and LISTENing."""
        wrapper = connections[self.alias]
        wrapper.close()
        wrapper.ensure_connection()
        conn: psycopg.Connection[Any] = wrapper.connection
        conn.execute(sql.SET_APPLICATION_NAME, [self.application_name])
        conn.execute(listen_statement(self.channel))
        return conn

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        while not self.halt.is_set():
            if self._reset.is_set():
                self._reset.clear()
                logger.warning("LISTEN connection missed its probe; reconnecting.")
                raise psycopg.OperationalError("probe not received")
            # Collected first: the driver holds the connection while it waits, and
            # ``on_notify`` may claim on it. ``stop_after=1`` returns as soon as a packet of
            # notifications arrives; any that come while the connection is busy are kept by
            # the driver for the next wait.
            wait = QUIET_SLICE if self._deferred else POLL_SLICE
            payloads = [n.payload for n in conn.notifies(timeout=wait, stop_after=1)]
            for payload in dict.fromkeys(payloads):
                if payload.startswith(PROBE_PREFIX):
                    self.on_probe(payload)
                else:
                    self.on_notify(payload)
            if self._deferred and (
                not payloads or time.monotonic() - self._deferred_since >= DEFER_MAX
            ):
                deferred, self._deferred = self._deferred, {}
                for work in deferred.values():
                    try:
                        work()
                    except LOST:
                        raise
                    except Exception:  # a bug in deferred work must not stop the listening
                        logger.exception("Deferred work of the listener failed.")
