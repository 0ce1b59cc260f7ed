"""Database plumbing shared by the worker's threads: outage handling and connection labels.

Every worker thread uses its own Django connection (Django keeps them per thread). When the
database goes away, the failing call closes that thread's connection, waits with capped
exponential backoff and retries; the first failure of an outage logs one WARNING and the
recovery one INFO line, so a Postgres restart is two log lines, not a storm.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.backends.signals import connection_created

from ..exceptions import Stopped
from . import sql

logger = logging.getLogger("django_pgqueue.worker")

#: Errors that mean "the connection or the server is gone", worth a reconnect and a retry.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError)

BACKOFF_FIRST = 0.05
BACKOFF_MAX = 5.0
#: An outage is reported again after this many seconds, then at doubling intervals of at
#: most REPORT_MAX: a worker that waits for its database never looks hung.
REPORT_FIRST = 10.0
REPORT_MAX = 60.0


def backoff_schedule(first: float = BACKOFF_FIRST, cap: float = BACKOFF_MAX) -> Callable[[], float]:
    """A function giving the next wait of a doubling backoff capped at ``cap`` seconds."""
    state = {"next": first}

    def step() -> float:
        delay = state["next"]
        state["next"] = min(cap, delay * 2)
        return delay

    return step


def close_connection(alias: str) -> None:
    """Drop this thread's connection, whatever state it is in (the next query reconnects)."""
    try:
        connections[alias].close()
    except DatabaseError:
        # Closing a connection the server already dropped may fail; it is gone either way.
        pass


def is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, CONNECTION_ERRORS):
        return True
    # Django's "connection already closed" after a server-side kill arrives as a plain
    # DatabaseError on some code paths; the wrapped psycopg error tells the truth.
    cause = exc.__cause__
    return cause is not None and type(cause).__name__ in {"OperationalError", "InterfaceError"}


def retrying[T](
    what: str,
    call: Callable[[], T],
    *,
    alias: str,
    abort: threading.Event | None = None,
) -> T:
    """Run ``call``; on a lost connection, reconnect with capped backoff until it succeeds.

    ``abort`` set -> give up and raise :class:`Stopped`. Errors other than connection errors
    propagate at once: they are bugs or bad data, and retrying would loop.
    """
    next_delay: Callable[[], float] | None = None
    started = 0.0
    report = OutageReport(what)
    while True:
        try:
            result = call()
        except DatabaseError as exc:
            if not is_connection_error(exc):
                raise
            close_connection(alias)
            if next_delay is None:
                next_delay = backoff_schedule()
                started = time.monotonic()
                logger.warning(
                    "Database unavailable during %s (%s); reconnecting with backoff.",
                    what,
                    first_line(exc),
                )
            delay = next_delay()
            report.still(exc, delay)
            if abort is not None:
                if abort.wait(delay):
                    raise Stopped(what) from exc
            else:
                time.sleep(delay)
            continue
        if next_delay is not None:
            logger.info(
                "Database reachable again for %s after %.1fs.", what, time.monotonic() - started
            )
        return result


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class OutageReport:
    """Says again, now and then, that an outage ``what`` waits through still lasts."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.started = time.monotonic()
        self._every = REPORT_FIRST
        self._next = self.started + REPORT_FIRST

    def still(self, exc: BaseException, delay: float) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        logger.warning(
            "Database still unavailable during %s after %.0fs (%s); retrying every %.1fs.",
            self.what,
            now - self.started,
            first_line(exc),
            delay,
        )
        self._every = min(self._every * 2, REPORT_MAX)
        self._next = now + self._every


def describe_database(alias: str) -> str:
    """``'default' (name at host:port)``: which database a line about it means."""
    settings = connections[alias].settings_dict
    host = settings.get("HOST") or "local socket"
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    return f"{alias!r} ({settings.get('NAME')} at {host}{port})"


def reach_database(alias: str, *, timeout: float, stop: threading.Event) -> str | None:
    """Connect this thread to the database, retrying with backoff for up to ``timeout``
    seconds: None once connected or when ``stop`` is set, else why it could not, logged in
    one line (the worker's start then fails instead of waiting for ever)."""
    deadline = time.monotonic() + timeout
    next_delay = backoff_schedule()
    report = OutageReport("start-up")
    first = True
    while True:
        try:
            connections[alias].ensure_connection()
            if not first:
                logger.info("Database %s reachable.", describe_database(alias))
            return None
        except DatabaseError as exc:
            if not is_connection_error(exc):
                raise
            close_connection(alias)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                logger.error(
                    "Cannot reach the database %s within %ss (--startup-timeout): %s. Check "
                    "DATABASES[%r] (host, port, name, credentials).",
                    describe_database(alias),
                    f"{timeout:g}",
                    first_line(exc),
                    alias,
                )
                return first_line(exc)
            if first:
                logger.warning(
                    "Database %s unreachable at start (%s); retrying for up to %ss "
                    "(--startup-timeout).",
                    describe_database(alias),
                    first_line(exc),
                    f"{timeout:g}",
                )
                first = False
            delay = next_delay()
            report.still(exc, delay)
            if stop.wait(min(delay, remaining)):
                return None


def label_connections(worker_id: str, alias: str) -> Callable[[], None]:
    """Name each connection opened from now on in pg_stat_activity, the calling thread's
    own included (it is opened again); returns what stops the naming.

    ``application_name`` = ``pgq_worker:<worker id>:<thread name>`` lets operators (and the
    fault tests) tell the fetch, completion and handler connections apart.
    """

    def receiver(sender: Any, connection: Any, **kwargs: Any) -> None:
        name = f"pgq_worker:{worker_id}:{threading.current_thread().name}"[:63]
        with connection.cursor() as cursor:
            cursor.execute(sql.SET_APPLICATION_NAME, [name])

    connection_created.connect(receiver, weak=False)
    own = connections[alias]
    if own.connection is not None and not own.in_atomic_block:
        own.close()

    def stop() -> None:
        connection_created.disconnect(receiver)

    return stop
