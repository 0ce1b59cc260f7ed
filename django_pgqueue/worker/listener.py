"""The LISTEN connection: a dedicated psycopg connection whose NOTIFYs wake the worker.

NOTIFY is only a hint, so this thread never touches messages: it tells the worker which
queue has news. When the connection drops it reconnects with capped backoff, LISTENs again
and asks for one catch-up fetch (notifications sent meanwhile are lost). A private probe
payload, sent now and then by the worker on its query connection, proves the listener still
hears; a probe that never arrives makes the worker call :meth:`Listener.reconnect`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from django.db import connections

from ..core.notify import listen_statement
from .db import backoff_schedule

logger = logging.getLogger("django_pgqueue.worker")

#: Payloads starting with this are the worker's own probes; no queue name can start so.
PROBE_PREFIX = "~probe "

# How long one wait for notifications lasts before the thread checks whether to stop.
POLL_SLICE = 0.25


def connect_params(alias: str) -> dict[str, Any]:
    """psycopg connect() arguments of a Django database alias."""
    params = dict(connections[alias].get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    return params


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Listener(threading.Thread):
    def __init__(
        self,
        *,
        alias: str,
        channel: str,
        application_name: str,
        on_notify: Callable[[str], None],
        on_reconnect: Callable[[], None],
        on_probe: Callable[[str], None],
    ) -> None:
        super().__init__(name="listener", daemon=True)
        self.params = connect_params(alias)
        self.params["application_name"] = application_name[:63]
        self.channel = channel
        self.on_notify = on_notify
        self.on_reconnect = on_reconnect
        self.on_probe = on_probe
        self.ready = threading.Event()
        self._halt = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._reset = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def reconnect(self) -> None:
        """Drop the connection and listen again (the probe found it deaf)."""
        self._reset.set()

    def run(self) -> None:
        next_delay: Callable[[], float] | None = None
        outage_started = 0.0
        first = True
        while not self._halt.is_set():
            try:
                conn = psycopg.connect(**self.params, autocommit=True)
            except psycopg.Error as exc:
                if next_delay is None:
                    next_delay = backoff_schedule()
                    outage_started = time.monotonic()
                    logger.warning(
                        "LISTEN connection failed (%s); retrying with backoff.", _first_line(exc)
                    )
                self._halt.wait(next_delay())
                continue
            try:
                conn.execute(listen_statement(self.channel))
                self._conn = conn
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
                self._listen(conn)
            except psycopg.Error as exc:
                if self._halt.is_set():
                    break
                if next_delay is None:
                    next_delay = backoff_schedule()
                    outage_started = time.monotonic()
                    logger.warning("LISTEN connection lost (%s); reconnecting.", _first_line(exc))
                self._halt.wait(next_delay())
            finally:
                self._conn = None
                try:
                    conn.close()
                except psycopg.Error:
                    pass

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        while not self._halt.is_set():
            if self._reset.is_set():
                self._reset.clear()
                logger.warning("LISTEN connection missed its probe; reconnecting.")
                raise psycopg.OperationalError("probe not received")
            for note in conn.notifies(timeout=POLL_SLICE):
                payload = note.payload
                if payload.startswith(PROBE_PREFIX):
                    self.on_probe(payload)
                else:
                    self.on_notify(payload)
