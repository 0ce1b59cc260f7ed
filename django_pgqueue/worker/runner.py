"""The worker: fetch -> execute -> complete, with wake-ups, heartbeats and graceful shutdown.

Threads and the connection each one uses:

- main: fetches (leases) batches sized to the free slots, enforces sync timeouts, sends the
  listener probe, logs the status line; its own Django connection, a claim session
  (``execution.dedicate_to_claims``);
- ``completer``: archives finished messages and records failures in batches, extends the
  leases of in-flight messages and upserts the heartbeat row; its own Django connection;
- ``listener``: LISTEN on its own Django connection (unless ``--no-listen``), also a claim
  session: an idle worker claims there (``Worker._claim_on_notify``);
- ``maintenance``: retention every ``RETENTION_INTERVAL`` (``maintenance.py``), when this
  worker's turn comes; its own Django connection, closed between runs;
- ``head watcher``: while claims walk from their bounds (a fair queue's fair order, or a
  claim index at whose head a long transaction elsewhere keeps dead entries), looks at the
  head for what fell due below them (``head_watch.py``); its own Django connection, held
  only meanwhile;
- ``handler-N`` threads and one ``async-handlers`` event loop: run the handlers (a handler's
  own queries use that thread's connection);
- ``http`` (with ``--metrics-port`` / ``--health-port``): answers scrapes and probes from what
  the other threads recorded, without a query (``endpoints.py``, ``health.py``).
- ``signals`` (``pgq_worker`` in its own process): acts on SIGTERM and SIGINT, which the
  signal handler only hands over (``signals.py``); no connection.

Every one of these threads is supervised: an unexpected error in its own machinery (not in a
handler, whose errors are failed attempts) is logged with its traceback and stops the worker,
which releases what it can and exits 1 (``Worker._on_crash``). A worker never runs on with a
thread missing.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.signals import connection_created

from ..conf import MAX_BATCH_SIZE, MAX_CONCURRENCY, get_settings
from ..core import _execution, _sql, transitions
from ..core._claim_bound import ClaimBounds
from ..core._flow_control import flow_config
from ..core._notify import CANCEL_PREFIX, cancel_payload, read_wake_payload
from ..core._registry import registry
from ..core._validation import QueueNameError, validate_queue_name
from ..metrics.instruments import Instruments
from ..models import DeadReason, Message
from ..periodic import Ticker
from . import endpoints, health, heartbeat
from . import sql as worker_sql
from .completer import Completer
from .db import (
    Stopped,
    describe_database,
    is_connection_error,
    label_connection,
    reach_database,
    retrying,
)
from .discovery import autodiscover
from .executor import Executor, Job
from .head_watch import HeadWatcher
from .heartbeat import Heartbeat
from .limited import LimitedQueues
from .listener import PROBE_PREFIX, Listener
from .maintenance import Maintainer
from .signals import SignalRelay

logger = logging.getLogger("django_pgqueue.worker")

#: Seconds between status lines (processed/s, in flight, retries, dead).
STATUS_INTERVAL = 30.0
#: Seconds between listener probes; a probe not heard by the next one means a deaf listener.
PROBE_INTERVAL = 15.0
#: Seconds of handler work a worker keeps leased beyond what is running (see _capacity).
PREFETCH_SECONDS = 1.0
#: A heartbeat extends leases at least this many times per visibility timeout.
BEATS_PER_LEASE = 3

#: The longest an idle worker sleeps on a far-future message (it polls meanwhile anyway).
LONGEST_DUE_WAIT = 3600.0

#: Seconds a starting worker tries to reach its database before it exits 1 (--startup-timeout).
STARTUP_TIMEOUT = 15.0


@dataclass
class WorkerOptions:
    """What ``manage.py pgq_worker`` flags set; ``None`` means the ``PGQUEUE`` setting."""

    queues: list[str] = field(default_factory=list)
    exclude_queues: list[str] = field(default_factory=list)
    concurrency: int | None = None
    batch_size: int | None = None
    visibility_timeout: float | None = None
    poll_interval: float | None = None
    listen: bool = True
    burst: bool = False
    max_messages: int | None = None
    worker_id: str | None = None
    healthcheck_file: str | Path | None = None
    grace_period: float | None = None
    install_signal_handlers: bool = True
    #: Serve ``/metrics`` (needs prometheus_client) on this port; 0: any free port (logged).
    metrics_port: int | None = None
    #: Serve ``/healthz`` and ``/readyz`` on this port (may be the metrics port).
    health_port: int | None = None
    #: The address both endpoints listen on.
    http_host: str = "0.0.0.0"
    #: Seconds without a successful database round trip after which the health probes fail.
    health_db_timeout: float | None = None
    #: Seconds a starting worker tries to reach its database before it gives up (exit 1).
    startup_timeout: float = STARTUP_TIMEOUT


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    """One worker process's engine. ``run()`` blocks and returns the exit code."""

    def __init__(self, options: WorkerOptions | None = None) -> None:
        self.options = options = options or WorkerOptions()
        conf = get_settings()
        self.conf = conf
        self.alias = conf.DATABASE_ALIAS
        self.worker_id = options.worker_id or default_worker_id()
        self.hostname = socket.gethostname()
        self.concurrency = options.concurrency or conf.CONCURRENCY
        self.batch_size = options.batch_size or conf.BATCH_SIZE
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be a whole number in [1, {MAX_CONCURRENCY}]")
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch size must be a whole number in [1, {MAX_BATCH_SIZE}]")
        self.poll_interval = options.poll_interval or conf.POLL_INTERVAL
        # Where the main loop's and the listener's claims start their walk of the claim index;
        # the head watcher looks at its head in their stead.
        self.claim_bounds = ClaimBounds(head_walks_in_claims=False)
        self.grace_period = (
            conf.GRACE_PERIOD if options.grace_period is None else options.grace_period
        )
        if options.max_messages is not None and options.max_messages < 1:
            raise ValueError("max_messages must be >= 1")
        self.fixed_queues = [validate_queue_name(q) for q in dict.fromkeys(options.queues)]
        self.excluded = {validate_queue_name(q) for q in options.exclude_queues}
        self.fixed_queues = [q for q in self.fixed_queues if q not in self.excluded]
        if options.queues and not self.fixed_queues:
            raise ValueError("every --queue is also excluded: nothing to do")
        self.listening = options.listen and conf.NOTIFY
        self.heartbeat_interval = self._heartbeat_interval()
        self.health_file = Path(options.healthcheck_file) if options.healthcheck_file else None
        self.health_db_timeout = health.db_timeout(
            options.health_db_timeout,
            poll_interval=self.poll_interval,
            heartbeat_interval=self.heartbeat_interval,
        )

        self.stats = heartbeat.Stats()
        # Its own window: the heartbeat's look must not reset it.
        self._status_rate = self.stats.rate_window()
        self.instruments = Instruments()
        self.db_ok_at = time.monotonic()  # the last successful database round trip
        self._main_thread: threading.Thread | None = None
        self._loop_ended = False
        self.ready = threading.Event()  # test seam: set once the worker takes messages
        self.stopped = threading.Event()  # set when run() has finished cleaning up
        self._wake = threading.Event()
        self._stop = threading.Event()  # graceful: stop fetching, drain
        self._force = threading.Event()  # second signal: release now
        self._abort_io = threading.Event()  # stop retrying writes through an outage
        self._notified: set[str] = set()
        self._retried_queues: set[str] = set()
        self._notify_lock = threading.Lock()
        # Held while messages are leased and dispatched: by the main loop, or by the listener
        # thread claiming for an idle worker (see _claim_on_notify).
        self._fetch_lock = threading.Lock()
        self._claims_on_notify = True
        self._due_hint: float | None = None  # monotonic; found by the listener thread
        self._catch_up = False
        self._want_capacity = False
        self._probe_sent: str | None = None
        self._probe_heard: str | None = None
        self._probe_seq = 0
        # Probes of this run only: other workers' probes (and a restarted worker's under the
        # same id) arrive on the same channel.
        self._probe_mine = f"{PROBE_PREFIX}{self.worker_id} {uuid.uuid4().hex[:12]} "
        self._bad_notify_logged = False
        self._cancel_notice = cancel_payload(self.worker_id)
        #: The thread whose unexpected error stopped the worker, if one did.
        self.crashed: str | None = None
        #: Why the start could not reach the database, if it could not (the run exits 1).
        self.unreachable: str | None = None
        self.taken = 0
        self._exit_code = 0
        self._ready_at = 0.0
        self._hot: list[str] = []
        self._known: list[str] = list(self.fixed_queues)
        # Queues whose last claim a limit or a rate cut short, until they are claimed again.
        self._limited = LimitedQueues(ceiling=self.poll_interval)
        self._rotation = 0

        self.completer = Completer(
            alias=self.alias,
            flush_interval=conf.COMPLETION_FLUSH_INTERVAL,
            flush_size=self.batch_size,
            stats=self.stats,
            abort=self._abort_io,
            on_retried=self._on_retried,
            on_written=self._on_written,
            log_error_chars=conf.LOG_ERROR_CHARS,
            instruments=self.instruments,
            on_crash=self._on_crash,
        )
        self.executor = Executor(
            concurrency=self.concurrency,
            worker_id=self.worker_id,
            alias=self.alias,
            completer=self.completer,
            on_finished=self._on_finished,
            on_deadline=self._wake.set,
            on_crash=self._on_crash,
            instruments=self.instruments,
        )
        self.listener: Listener | None = None
        self.head_watcher = HeadWatcher(alias=self.alias, bounds=self.claim_bounds, stop=self._stop)
        # Bound now, so that a port in use fails the start; served once run() begins.
        self.servers = endpoints.bind_for_worker(self)

    # -- control (any thread, or a signal handler) ---------------------------------------------

    def request_stop(self) -> None:
        """Graceful stop: no new messages, in-flight ones finish within the grace period."""
        if self._stop.is_set():
            self.force_stop()
            return
        self._stop.set()
        self._wake.set()

    def force_stop(self) -> None:
        """Release unfinished leases now and exit non-zero."""
        self._stop.set()
        self._force.set()
        self._abort_io.set()
        self._wake.set()

    def _on_crash(self, thread: str, exc: BaseException) -> None:
        """An unexpected error in ``thread``'s own machinery: stop the worker, exit 1.

        A worker missing a thread would look alive while it no longer archives, extends its
        leases or hears wake-ups; a supervisor restarts a worker that exits. Without a
        completer nothing more can be written: what it held is released at once.
        """
        with self._notify_lock:
            first = self.crashed is None
            if first:
                self.crashed = thread
        logger.critical(
            "Internal error in the %s thread (%s); %s",
            thread,
            type(exc).__name__,
            "stopping the worker: it exits 1 once it has released what it holds."
            if first
            else "the worker is already stopping.",
            exc_info=exc,
        )
        if not first:
            return
        self._exit_code = 1
        if thread.startswith("completer"):
            self.force_stop()
        else:
            self._stop.set()
            self._wake.set()

    def _on_signal(self, signum: int) -> None:
        """SIGTERM or SIGINT, in the signal relay's thread (``signals.py``)."""
        if self._stop.is_set():
            logger.warning(
                "Second %s: releasing unfinished messages now.", signal.Signals(signum).name
            )
            self.force_stop()
        else:
            logger.info(
                "%s: finishing %d in-flight messages (grace period %ss); send it again to stop now.",
                signal.Signals(signum).name,
                self.executor.in_flight(),
                self.grace_period,
            )
            self.request_stop()

    def _capacity(self) -> int:
        """How many leased messages this worker may hold: running plus waiting locally.

        Fast handlers: up to two batches wait, so a lease round trip never starves them.
        Slow handlers: only about ``PREFETCH_SECONDS`` of work waits, so one worker does not
        hoard messages other workers could run now.
        """
        mean = self.executor.mean_run
        waiting = 2 * self.batch_size
        if mean > 0:
            waiting = min(waiting, max(1, int(self.concurrency * PREFETCH_SECONDS / mean)))
        return self.concurrency + waiting

    def _free(self) -> int:
        return self._capacity() - self.executor.in_flight()

    def _refill_at(self) -> int:
        # Lease full batches when handlers are fast; smaller ones when little may wait.
        return max(1, min(self.batch_size, (self._capacity() - self.concurrency) // 2))

    def _on_finished(self) -> None:
        if self.executor.in_flight() == 0:
            # Nothing else is running or waiting: no batch to wait for, so the outcomes
            # buffered so far are written now, not after COMPLETION_FLUSH_INTERVAL.
            self.completer.wake()
        if self._want_capacity:
            if self._free() >= self._refill_at():
                self._wake.set()
            elif self.executor.in_flight() == 0:
                self._wake.set()

    def _on_notify(self, payload: str) -> None:
        if payload.startswith(CANCEL_PREFIX):
            if payload == self._cancel_notice:
                # Once the connection is quiet; several notices in a row make one read.
                assert self.listener is not None
                self.listener.defer("cancel", self.heartbeat.read_cancel_flags)
            return
        queue, later = read_wake_payload(payload)
        if queue in self.excluded or (self.fixed_queues and queue not in self.fixed_queues):
            return
        try:
            validate_queue_name(queue)
        except QueueNameError:
            # Any role that may connect can NOTIFY this channel: a hint, never an order.
            self._ignore_notification(payload)
            return
        if later:
            # Scheduled messages: find when the next one falls due, once the connection is
            # quiet; the main loop wakes then.
            assert self.listener is not None
            self.listener.defer(("due", queue), lambda: self._hint_next_due(queue))
            return
        if self._claims_on_notify and self._claim_on_notify(queue):
            return
        with self._notify_lock:
            self._notified.add(queue)
        self._wake.set()

    def _claim_on_notify(self, queue: str) -> bool:
        """In the listener thread: an idle worker claims the notified queue's messages on the
        LISTEN connection and hands them to the handlers itself. True when that settled the
        notification; False leaves it to the main loop (busy worker, nothing ready, more
        ready than one batch, or a claim already under way).

        Why: this is the idle latency. Waking the main loop to claim costs one thread
        hand-off more than claiming here.
        """
        if self.executor.in_flight() or self.options.burst or self.options.max_messages:
            return False
        if not self._fetch_lock.acquire(blocking=False):
            return False
        try:
            if self._stop.is_set() or self.executor.in_flight():
                return False
            want = self.batch_size
            batch: list[Message] = []
            try:
                batch = self._lease_one_queue(queue, want)
            except Exception as exc:
                if isinstance(exc, DatabaseError) and is_connection_error(exc):
                    raise  # the listener reconnects and asks for a catch-up fetch
                # Anything else (a bug) must not cost the worker its listener.
                self._stop_claiming_on_notify(exc)
                return False
            finally:
                if batch:
                    self._dispatch(batch)
            room_soon = self._note_claim(queue, len(batch), want)
            if not batch:
                return False  # perhaps a delayed message: the main loop plans its wake-up
            if len(batch) >= want or room_soon:
                return False  # more may be ready now or soon: the main loop goes on
        finally:
            self._fetch_lock.release()
        return True  # drained (scheduled messages come with a wake-up of their own)

    def _hint_next_due(self, queue: str) -> None:
        """In the listener thread: tell the main loop when ``queue``'s next message is due."""
        seconds = self._seconds_to_next_due([queue])
        if seconds is not None:
            with self._notify_lock:
                due = _due_at(seconds)
                self._due_hint = due if self._due_hint is None else min(self._due_hint, due)
            self._wake.set()

    def _ignore_notification(self, payload: str) -> None:
        level = logging.DEBUG if self._bad_notify_logged else logging.WARNING
        self._bad_notify_logged = True
        logger.log(
            level,
            "Ignored a notification on channel %r that names no queue: %r%s",
            self.conf.NOTIFY_CHANNEL,
            payload[:100],
            "" if level == logging.DEBUG else " (further ones are logged at DEBUG).",
        )

    def _stop_claiming_on_notify(self, exc: BaseException) -> None:
        self._claims_on_notify = False
        logger.error(
            "Claiming on the LISTEN connection failed (%s: %s); the main loop claims "
            "everything from now on.",
            type(exc).__name__,
            exc,
            exc_info=exc,
        )

    def _on_retried(self, queues: set[str]) -> None:
        # A retry sends no NOTIFY: look up when it falls due instead of waiting for a poll.
        with self._notify_lock:
            self._retried_queues.update(queues)
        self._wake.set()

    def _on_written(self, queues: set[str]) -> None:
        # Leases ended: a limited queue waiting for room may have some now.
        freed = self._limited.room_freed(queues)
        if freed:
            with self._notify_lock:
                self._notified.update(freed)
            self._wake.set()

    def _on_reconnect(self) -> None:
        self.instruments.listener_reconnected()
        self._catch_up = True
        self._wake.set()

    def _on_probe(self, payload: str) -> None:
        if payload.startswith(self._probe_mine):
            self._probe_heard = payload

    # -- settings per queue and task -------------------------------------------------------------

    def _heartbeat_interval(self) -> float:
        """``HEARTBEAT_INTERVAL``, but at least ``BEATS_PER_LEASE`` beats per shortest lease."""
        queues = self.fixed_queues or [self.conf.DEFAULT_QUEUE, *self.conf.QUEUES]
        vts = [self._vt(q) for q in queues]
        vts += [h.visibility_timeout for h in registry.handlers() if h.visibility_timeout]
        return min(self.conf.HEARTBEAT_INTERVAL, min(vts) / BEATS_PER_LEASE)

    def _vt(self, queue: str) -> float:
        if self.options.visibility_timeout is not None:
            return float(self.options.visibility_timeout)
        return float(self.conf.for_queue(queue, "VISIBILITY_TIMEOUT"))

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> int:
        self._main_thread = threading.current_thread()
        self._serve_endpoints()  # probes say "starting" until the worker is ready
        receiver = label_connection(self.worker_id)
        connection_created.connect(receiver, weak=False)
        main = connections[self.alias]
        if main.connection is not None and not main.in_atomic_block:
            # Reconnect so this connection carries the worker's label too.
            main.close()
        # The main thread of its own process (pgq_worker), or a thread of a host (tests, embedding).
        own_process = threading.current_thread() is threading.main_thread()
        signals = None
        if self.options.install_signal_handlers and own_process:
            signals = SignalRelay(
                self._on_signal, (signal.SIGTERM, signal.SIGINT), on_crash=self._on_crash
            )
        try:
            if not self._reach_database():
                return 1 if self.unreachable else 0
            handlers = autodiscover()
            # Handlers are known now; their own visibility timeouts may be shorter.
            self.heartbeat_interval = self._heartbeat_interval()
            try:
                self._start(handlers)
                if own_process:
                    _freeze_startup_objects()
                self._loop()
            except Stopped:
                pass
            except Exception as exc:
                self._on_crash("main loop", exc)
            self._loop_ended = True
            return self._shutdown()
        finally:
            if signals is not None:
                signals.close()
            connection_created.disconnect(receiver)
            _execution.end_claim_session(connections[self.alias])
            if not own_process:
                # That thread's connection would outlive it otherwise.
                connections.close_all()
            for server in self.servers:
                server.stop()
            self.stopped.set()

    def _reach_database(self) -> bool:
        """False when the start cannot go on: the database stayed unreachable for
        ``startup_timeout`` seconds (logged in one line), or a signal stopped the wait."""
        why = reach_database(self.alias, timeout=self.options.startup_timeout, stop=self._stop)
        if why is not None:
            self.unreachable = why
            logger.error(
                "Cannot reach the database %s within %ss (--startup-timeout): %s. Check "
                "DATABASES[%r] (host, port, name, credentials).",
                describe_database(self.alias),
                f"{self.options.startup_timeout:g}",
                why,
                self.alias,
            )
            return False
        return not self._stop.is_set()

    def _serve_endpoints(self) -> None:
        for server in self.servers:
            server.start()
            paths = ", ".join(sorted(server.routes))
            logger.info(
                "pgq_worker %s serves %s on http://%s:%d",
                self.worker_id,
                paths,
                self.options.http_host,
                server.port,
            )

    # -- health (any thread) -------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        """True once the worker stopped taking messages."""
        return self._stop.is_set() or self._loop_ended

    def _db_ok(self) -> None:
        self.db_ok_at = time.monotonic()

    def database_silence(self) -> float:
        """Seconds since the last successful database round trip."""
        return max(0.0, time.monotonic() - self.db_ok_at)

    def dead_threads(self) -> list[str]:
        """The internal threads that should be running and are not."""
        dead = [
            name
            for name, thread in (
                ("main loop", self._main_thread),
                ("completer", self.completer),
            )
            if thread is not None and not thread.is_alive()
        ]
        # The listener and the head watcher stop first when the worker drains, on purpose.
        if self.listener is not None and not self.draining and not self.listener.is_alive():
            dead.append("listener")
        watcher = self.head_watcher
        if watcher.started and not self.draining and not watcher.is_alive():
            dead.append("head watcher")
        return dead + self.executor.dead_threads()

    def _start(self, handlers: list[str]) -> None:
        self.heartbeat = Heartbeat(
            interval=self.heartbeat_interval,
            alias=self.alias,
            worker_id=self.worker_id,
            queues=self.fixed_queues,
            concurrency=self.concurrency,
            executor=self.executor,
            stats=self.stats,
            health_file=self.health_file,
            halt=self.completer.halt,
            on_db_ok=self._db_ok,
        )
        self.completer.heartbeat = self.heartbeat
        self.completer.start()
        self.executor.start()
        self.head_watcher.start()
        interval = self.conf.RETENTION_INTERVAL
        if interval is not None and not self.options.burst:
            # Retention (core/_retention.py): one worker per interval does it, in this thread.
            Maintainer(
                alias=self.alias, worker_id=self.worker_id, interval=interval, stop=self._stop
            ).start()
        if self.listening:
            self.listener = Listener(
                alias=self.alias,
                channel=self.conf.NOTIFY_CHANNEL,
                application_name=f"pgq_worker:{self.worker_id}:listener",
                on_notify=self._on_notify,
                on_reconnect=self._on_reconnect,
                on_probe=self._on_probe,
                on_crash=self._on_crash,
            )
            self.listener.start()
            if not self.listener.ready.wait(10):
                logger.warning("LISTEN connection not up yet; polling until it is.")
        retrying(
            "registering the worker",
            lambda: self.heartbeat.write_row(first=True),
            alias=self.alias,
            abort=self._stop,
        )
        logger.info(
            "pgq_worker %s ready: queues=%s%s concurrency=%d batch=%d visibility=%s "
            "poll=%ss listen=%s burst=%s grace=%ss handlers=%s",
            self.worker_id,
            ",".join(self.fixed_queues) or "all",
            f" (excluding {','.join(sorted(self.excluded))})" if self.excluded else "",
            self.concurrency,
            self.batch_size,
            f"{self.options.visibility_timeout}s"
            if self.options.visibility_timeout
            else "per queue",
            self.poll_interval,
            "on" if self.listening else "off",
            "on" if self.options.burst else "off",
            self.grace_period,
            ",".join(handlers) or "none",
        )
        if not handlers:
            logger.warning(
                "No handlers are registered: every message will be dead-lettered as rejected. "
                "Put them in a 'handlers' or 'tasks' module of an installed app."
            )
        self._ready_at = time.monotonic()
        self.ready.set()

    # -- the main loop ---------------------------------------------------------------------------

    def _loop(self) -> None:
        burst = self.options.burst
        max_messages = self.options.max_messages
        refresh = True
        due_check: set[str] = set()
        now = time.monotonic()
        next_poll = now + self.poll_interval
        next_due: float | None = None
        next_status = now + STATUS_INTERVAL
        next_probe = now + PROBE_INTERVAL
        stale_every = self.conf.STALE_READY_WARNING
        next_stale = now + min(stale_every, 60.0)
        burst_checked = False
        # Periodic schedules (periodic.py): due slots are enqueued from this loop.
        ticker = None if burst else Ticker(self.alias)
        next_tick = now
        while not self._stop.is_set():
            now = time.monotonic()
            if ticker and now >= next_tick:
                next_tick = time.monotonic() + ticker.run_due()
            next_deadline = self.executor.expire_overdue(now)
            if self.executor.stuck > self.concurrency:
                # Only a new process frees threads stuck in handlers: stop, exit non-zero,
                # and let the supervisor start a fresh worker.
                logger.error(
                    "%d handler threads are stuck past their timeout; stopping so that a "
                    "supervisor restarts the worker.",
                    self.executor.stuck,
                )
                self._exit_code = 1
                break
            with self._notify_lock:
                notified, self._notified = self._notified, set()
                due_hint, self._due_hint = self._due_hint, None
            if due_hint is not None and (next_due is None or due_hint < next_due):
                next_due = due_hint
            if self._catch_up:
                self._catch_up = False
                refresh = True
            if next_due is not None and now >= next_due:
                next_due, refresh = None, True
            if now >= next_poll:
                refresh = True
                next_poll = now + self.poll_interval
            if refresh:
                self._refresh_queues()
                refresh = False
                next_due = None
                due_check.update(self._known)
            with self._notify_lock:
                due_check.update(self._retried_queues)
                self._retried_queues.clear()
            for queue in [*notified, *self._limited.due(now)]:
                if queue not in self._hot:
                    self._hot.insert(0, queue)
                if queue not in self._known:
                    self._known.append(queue)

            in_flight = self.executor.in_flight()
            free = self._free()
            want = min(self.batch_size, free)
            if max_messages is not None:
                want = min(want, max_messages - self.taken)
                if want <= 0 and in_flight == 0:
                    logger.info("Handled --max-messages=%d; stopping.", max_messages)
                    break
            if self._hot and want > 0 and (free >= self._refill_at() or in_flight == 0):
                got = self._fetch(want)
                if got:
                    burst_checked = False
                    next_poll = time.monotonic() + self.poll_interval
                    continue
            if not self._hot and burst:
                if in_flight == 0:
                    # Let the completer write retries first: one may be ready again at once.
                    self._drain_completer()
                    if burst_checked:
                        elapsed = time.monotonic() - self._ready_at
                        logger.info(
                            "Burst done: nothing ready is left; %d messages in %.2fs (%.0f/s).",
                            self.taken,
                            elapsed,
                            self.taken / elapsed if elapsed > 0 else 0.0,
                        )
                        break
                    burst_checked, refresh = True, True
                    continue
            if not self._hot and due_check and not burst:
                # Only queues that may have changed: a refresh, a NOTIFY, a retry scheduled.
                due = self._next_due(sorted(due_check))
                due_check.clear()
                if due is not None and (next_due is None or due < next_due):
                    next_due = due

            now = time.monotonic()
            if now >= next_status:
                self._status_line()
                next_status = now + STATUS_INTERVAL
            if self.listener is not None and now >= next_probe:
                self._probe()
                next_probe = now + PROBE_INTERVAL
            if now >= next_stale:
                self._warn_stale_ready(stale_every)
                next_stale = now + min(stale_every, 60.0)

            timers = [next_poll, next_status, next_stale]
            if ticker:
                timers.append(next_tick)
            if self.listener is not None:
                timers.append(next_probe)
            if next_due is not None:
                timers.append(next_due)
            retry_at = self._limited.next_at()
            if retry_at is not None:
                timers.append(retry_at)
            if next_deadline is not None:
                timers.append(next_deadline)
            timeout = max(0.0, min(timers) - time.monotonic())
            self._want_capacity = bool(self._hot) or burst or max_messages is not None
            if self._want_capacity and in_flight and not self._wake.is_set():
                # Recheck after publishing the flag: a handler may have finished meanwhile.
                if self._free() >= self._refill_at():
                    self._wake.set()
            self._wake.wait(timeout)
            self._wake.clear()
            self._want_capacity = False

    def _queues_in_order(self) -> list[str]:
        hot = self._hot
        if len(hot) > 1:
            # Rotate so every queue gets the first pick in turn.
            self._rotation = (self._rotation + 1) % len(hot)
            return hot[self._rotation :] + hot[: self._rotation]
        return list(hot)

    def _fetch(self, want: int) -> int:
        """Lease up to ``want`` messages from the hot queues and hand them to the executor."""
        leased: list[Message] = []
        with self._fetch_lock:
            try:
                self._lease_into(leased, want)
            finally:
                # Even when a stop interrupts the loop: what was leased runs (or is released).
                if leased:
                    self._dispatch(leased)
        return len(leased)

    def _lease_into(self, leased: list[Message], want: int) -> None:
        for queue in self._queues_in_order():
            asked = want - len(leased)
            if asked <= 0:
                break
            batch = retrying(
                "leasing messages",
                lambda q=queue, n=asked: self._lease_one_queue(q, n),  # type: ignore[misc]
                alias=self.alias,
                abort=self._stop,
            )
            if len(batch) < asked and queue in self._hot:
                self._hot.remove(queue)
            self._note_claim(queue, len(batch), asked)
            leased.extend(batch)

    def _note_claim(self, queue: str, got: int, asked: int) -> bool:
        """A limited queue's claim cut short is claimed again when room may be back (True)."""
        if got >= asked:
            self._limited.served(queue)
            return False
        flow = flow_config(queue)
        if flow is None or not flow.limited:
            return False
        self._limited.cut_short(queue, got, time.monotonic())
        return True

    def _lease_one_queue(self, queue: str, want: int) -> list[Message]:
        # Claims run on the main loop's and the listener's connections only, and nothing
        # else but the worker's own bookkeeping does: they may keep the claim's settings.
        # Its leases give their attempt back if they expire: the executor runs a redelivered
        # message alone (see "The attempt rule" in core/_sql.py).
        _execution.dedicate_to_claims(connections[self.alias], refund_on_expiry=True)
        batch = Message.objects.lease(
            queue,
            worker_id=self.worker_id,
            batch_size=want,
            visibility_timeout=self.options.visibility_timeout,
            using=self.alias,
            decode_payloads=False,  # each handler's thread decodes its own
            bounds=self.claim_bounds,
        )
        self.db_ok_at = time.monotonic()
        self.instruments.claimed(queue, len(batch))
        return batch

    def _dispatch(self, leased: list[Message]) -> None:
        jobs: list[Job] = []
        rejected: list[Message] = []
        for_queue = self.conf.for_queue
        for message in leased:
            handler = registry.get(message.task)
            if handler is None:
                rejected.append(message)
                continue
            vt = handler.visibility_timeout or self._vt(message.queue)
            timeout = handler.timeout or for_queue(message.queue, "TASK_TIMEOUT")
            jobs.append(Job(message, handler, vt, timeout))
        self.taken += len(leased)
        if jobs:
            self.executor.submit(jobs)
        for message in rejected:
            self.completer.fail(
                transitions.FailedAttempt(
                    lease=message,
                    error=transitions.error_entry(
                        attempt=message.attempts,
                        worker_id=self.worker_id,
                        type_name="UnknownTask",
                        message=f"no handler is registered for task {message.task!r} in this "
                        "worker; nothing was run",
                    ),
                    retry_in=None,
                    final_reason=DeadReason.REJECTED,
                ),
                message,
            )

    def _refresh_queues(self) -> None:
        if self.fixed_queues:
            self._hot = list(self.fixed_queues)
            return

        def live() -> list[str]:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(worker_sql.QUEUES_TO_SERVE)
                return [row[0] for row in cursor.fetchall()]

        queues = [
            q
            for q in retrying("listing queues", live, alias=self.alias, abort=self._stop)
            if q not in self.excluded
        ]
        self.db_ok_at = time.monotonic()
        self._known = queues
        self._hot = list(queues)

    def _next_due(self, queues: list[str]) -> float | None:
        """Monotonic time at which the earliest scheduled message of ``queues`` falls due."""
        seconds = retrying(
            "finding the next due message",
            lambda: self._seconds_to_next_due(queues),
            alias=self.alias,
            abort=self._stop,
        )
        return None if seconds is None else _due_at(seconds)

    def _seconds_to_next_due(self, queues: list[str]) -> float | None:
        """Seconds (database clock) until the earliest scheduled message of ``queues``."""
        earliest: float | None = None
        with connections[self.alias].cursor() as cursor:
            for queue in queues:
                cursor.execute(_sql.NEXT_DUE_AT, {"queue": queue})
                row = cursor.fetchone()
                if row and row[0] is not None:
                    seconds = min(float(row[0]), LONGEST_DUE_WAIT)
                    earliest = seconds if earliest is None else min(earliest, seconds)
        return earliest

    def _drain_completer(self) -> None:
        self.completer.wake()
        while self.completer.pending() and not self._force.is_set():
            time.sleep(0.002)

    # -- visibility --------------------------------------------------------------------------

    def _status_line(self) -> None:
        s = self.stats
        logger.info(
            "pgq_worker %s: %.1f processed/s, %d in flight, %d processed, %d retried, %d dead.",
            self.worker_id,
            self._status_rate.rate(),
            self.executor.in_flight(),
            s.processed,
            s.retried,
            s.dead,
        )

    def _probe(self) -> None:
        assert self.listener is not None
        if self._probe_sent is not None and self._probe_heard != self._probe_sent:
            self.listener.reconnect()
        self._probe_seq += 1
        payload = f"{self._probe_mine}{self._probe_seq}"

        def send() -> None:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(worker_sql.PROBE, [self.conf.NOTIFY_CHANNEL, payload])

        retrying("probing the listener", send, alias=self.alias, abort=self._stop)
        self._probe_sent = payload

    def _warn_stale_ready(self, threshold: float) -> None:
        def query() -> list[tuple[str, float]]:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(_sql.LIVE_QUEUES)
                queues = [row[0] for row in cursor.fetchall()]
                if not queues:
                    return []
                cursor.execute(worker_sql.STALE_READY, [queues, float(threshold)])
                return [(row[0], row[1]) for row in cursor.fetchall()]

        for queue, age in retrying(
            "checking waiting messages", query, alias=self.alias, abort=self._stop
        ):
            logger.warning(
                "Ready messages on queue %r have waited %.0fs (threshold %ss): no worker is "
                "taking them fast enough, or none serves this queue.",
                queue,
                age,
                threshold,
            )

    # -- shutdown ------------------------------------------------------------------------------

    def _shutdown(self) -> int:
        if self.listener is not None:
            self.listener.stop()
        with self._fetch_lock:  # a claim in the listener thread finishes dispatching first
            queued = self.executor.take_queued()
        if queued:
            self._release([j.message for j in queued], "not started")
        deadline = time.monotonic() + self.grace_period
        self._want_capacity = True
        while self.executor.in_flight() and not self._force.is_set():
            now = time.monotonic()
            if now >= deadline:
                logger.warning(
                    "Grace period of %ss is over with %d messages still running.",
                    self.grace_period,
                    self.executor.in_flight(),
                )
                break
            next_deadline = self.executor.expire_overdue(now)
            limit = deadline if next_deadline is None else min(deadline, next_deadline)
            if self._wake.wait(min(max(0.0, limit - now), 0.5)):
                self._wake.clear()
        code = self._exit_code
        # After an internal error, a message that ran keeps its attempt: were it what breaks
        # the worker, it must end dead after its attempts, not run again and again.
        reset_attempt = self.crashed is None
        if self.executor.in_flight():
            code = 1
            abandoned = self.executor.abandon_running()
            self._abort_io.set()  # do not hang on an outage now; leases expire by themselves
            self._release([j.message for j in abandoned], "unfinished", reset_attempt=reset_attempt)
        if self.crashed is not None and self.crashed.startswith("completer"):
            unwritten = self.completer.take_unwritten()
            if unwritten:
                self._release(unwritten, "finished but unrecorded", reset_attempt=False)
        self.completer.stop()
        self.completer.wake()
        self.completer.join(None if code == 0 else 2.0)
        try:
            retrying(
                "unregistering the worker",
                lambda: heartbeat.forget(alias=self.alias, worker_id=self.worker_id),
                alias=self.alias,
                # Tried once: during an outage the row is left to go stale.
                abort=self._stop,
            )
        except Stopped:
            pass
        if self.health_file is not None:
            self.health_file.unlink(missing_ok=True)
        self.executor.stop(wait=1.0 if code == 0 else 0.0)
        if self.listener is not None:
            self.listener.join(0.3)  # a daemon: it closes its connection itself
        logger.info(
            "pgq_worker %s stopped%s: %d processed, %d retried, %d dead.",
            self.worker_id,
            "" if code == 0 else " without finishing everything",
            self.stats.processed,
            self.stats.retried,
            self.stats.dead,
        )
        return code

    def _release(
        self, messages: Sequence[transitions.LeaseRef], what: str, *, reset_attempt: bool = True
    ) -> None:
        try:
            outcome = retrying(
                "releasing leases",
                lambda: transitions.release(
                    messages, reset_attempt=reset_attempt, using=self.alias
                ),
                alias=self.alias,
                # Tried at least once; a second signal stops retrying through an outage.
                abort=self._abort_io,
            )
        except Stopped:
            logger.warning("Could not release %d leases; they will expire.", len(messages))
            return
        logger.warning(
            "Released %d %s messages so they run again at once: %s",
            len(outcome.done),
            what,
            outcome.done[:20],
        )


def _freeze_startup_objects() -> None:
    """Move what exists after start-up (Django, the apps, the handlers: hundreds of thousands
    of objects that live as long as the process) out of the cyclic garbage collector's sight,
    so its collections scan only what the worker allocates since; nothing is lost: reference
    counting still frees what dies.
    Only in a worker process of its own (main thread), never in a host that embeds it."""
    gc.collect()
    gc.freeze()


def _due_at(seconds: float) -> float:
    # A hair late rather than early: an early wake-up finds nothing and sleeps again.
    return time.monotonic() + max(0.0, seconds) + 0.001


def run_worker(options: WorkerOptions | None = None, **kwargs: Any) -> int:
    """Build a :class:`Worker` from options (or keyword arguments) and run it."""
    return Worker(options or WorkerOptions(**kwargs)).run()


__all__ = ["Worker", "WorkerOptions", "default_worker_id", "run_worker"]
