"""The worker: composes its services, starts them, supervises them, stops them.

Each moving part is a service of its own (``service.py``), with its state and its timer:

- the main loop (``main_loop.py``, the calling thread): the fetcher (``fetcher.py``) claims
  batches sized to the free slots and hands them to the executor; the loop enforces sync
  handlers' deadlines and runs the chores (``chores.py``: periodic schedules, status line,
  listener probe, stale-ready warning); its own Django connection, a claim session
  (``_execution.dedicate_to_claims``);
- ``completer`` (``completer.py``): archives finished messages and records failures in
  batches (``outcomes.py``), writes handlers' progress reports (``progress.py``), and runs
  the heartbeat (``heartbeat.py``: lease extensions, cancel flags, the heartbeat row); its
  own Django connection;
- ``listener`` (``listener.py``): LISTEN on its own Django connection (unless
  ``--no-listen``), also a claim session: what a notification means is in
  ``notifications.py`` (an idle worker claims there);
- ``maintenance`` (``maintenance.py``): retention every ``RETENTION_INTERVAL``, when this
  worker's turn comes; its own Django connection, closed between runs;
- ``head watcher`` (``head_watch.py``): while claims walk from their bounds, looks at the
  head for what fell due below them; its own Django connection, held only meanwhile;
- the executor (``executor.py``): ``handler-N`` threads and one ``async-handlers`` event loop
  run the handlers (a handler's own queries use that thread's connection);
- ``http`` (with ``--metrics-port`` / ``--health-port``): answers scrapes and probes from what
  the other threads recorded, without a query (``endpoints.py``, ``health.py``);
- ``signals`` (``pgq_worker`` in its own process): acts on SIGTERM and SIGINT, which the
  signal handler only hands over (``signals.py``); no connection.

Every one of these threads is supervised: an unexpected error in its own machinery (not in a
handler, whose errors are failed attempts) is logged with its traceback and stops the worker,
which releases what it can and exits 1 (``Worker._on_crash``; ``shutdown.py``). A worker
never runs on with a thread missing.
"""

from __future__ import annotations

import gc
import logging
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from django.db import connections

from ..conf import get_settings
from ..core import _execution
from ..metrics.instruments import Instruments
from . import endpoints, health
from .chores import PeriodicSchedules, StaleReadyWarning, StatusLine
from .completer import Completer
from .db import Stopped, label_connections, reach_database, retrying
from .discovery import autodiscover
from .executor import Executor
from .fetcher import Fetcher
from .head_watch import HeadWatcher
from .heartbeat import Heartbeat, Stats, beat_interval
from .listener import Listener
from .main_loop import MainLoop
from .maintenance import Maintainer
from .notifications import compose_listening
from .options import WorkerOptions, check_sizes, default_worker_id, served_queues
from .service import Chore
from .shutdown import shut_down
from .signals import SignalRelay
from .wakeups import Wakeups

logger = logging.getLogger("django_pgqueue.worker")


class Worker:
    """One worker process's engine. ``run()`` blocks and returns the exit code."""

    def __init__(self, options: WorkerOptions | None = None) -> None:
        self.options = options = options or WorkerOptions()
        self.conf = conf = get_settings()
        self.alias = conf.DATABASE_ALIAS
        self.worker_id = options.worker_id or default_worker_id()
        self.hostname = socket.gethostname()
        self.concurrency = options.concurrency or conf.CONCURRENCY
        self.batch_size = options.batch_size or conf.BATCH_SIZE
        check_sizes(self.concurrency, self.batch_size, options.max_messages)
        self.fixed_queues, self.excluded = served_queues(options)
        self.poll_interval = options.poll_interval or conf.POLL_INTERVAL
        self.grace_period = (
            conf.GRACE_PERIOD if options.grace_period is None else options.grace_period
        )
        self.listening = options.listen and conf.NOTIFY
        self.health_file = Path(options.healthcheck_file) if options.healthcheck_file else None

        self.stats = Stats()
        self.instruments = Instruments()
        self.db_ok_at = time.monotonic()  # the last successful database round trip
        self.ready = threading.Event()  # test seam: set once the worker takes messages
        self.stopped = threading.Event()  # set when run() has finished cleaning up
        self.stopping = threading.Event()  # graceful: stop fetching, drain
        self.forced = threading.Event()  # second signal: release now
        self.abort_io = threading.Event()  # stop retrying writes through an outage
        self._crash_lock = threading.Lock()
        #: The thread whose unexpected error stopped the worker, if one did.
        self.crashed: str | None = None
        #: Why the start could not reach the database, if it could not (the run exits 1).
        self.unreachable: str | None = None
        self._exit_code = 0
        #: The thread running the main loop (the caller of run()).
        self.main_thread: threading.Thread | None = None
        self._loop_ended = False
        self._compose()
        self.health_db_timeout = health.db_timeout(
            options.health_db_timeout,
            poll_interval=self.poll_interval,
            heartbeat_interval=self.heartbeat.interval,
        )
        # Bound now, so that a port in use fails the start; served once run() begins.
        self.servers = endpoints.bind_for_worker(self)

    def _compose(self) -> None:
        """The parts; each other's callbacks wire them (threads start in ``_start``)."""
        conf, options = self.conf, self.options
        self.wakeups = Wakeups()
        self.completer = Completer(
            alias=self.alias,
            flush_interval=conf.COMPLETION_FLUSH_INTERVAL,
            flush_size=self.batch_size,
            stats=self.stats,
            abort=self.abort_io,
            on_retried=self.wakeups.retried,
            on_written=lambda queues: self.fetcher.on_written(queues),
            log_error_chars=conf.LOG_ERROR_CHARS,
            instruments=self.instruments,
            on_crash=self._on_crash,
        )
        self.executor = Executor(
            concurrency=self.concurrency,
            worker_id=self.worker_id,
            alias=self.alias,
            completer=self.completer,
            on_finished=lambda: self.fetcher.on_finished(),
            on_deadline=self.wakeups.wake,
            on_crash=self._on_crash,
            instruments=self.instruments,
        )
        self.fetcher = Fetcher(
            worker_id=self.worker_id,
            alias=self.alias,
            conf=conf,
            visibility_timeout=options.visibility_timeout,
            fixed_queues=self.fixed_queues,
            excluded=self.excluded,
            concurrency=self.concurrency,
            batch_size=self.batch_size,
            poll_interval=self.poll_interval,
            executor=self.executor,
            completer=self.completer,
            wakeups=self.wakeups,
            instruments=self.instruments,
            stop=self.stopping,
            on_db_ok=self._db_ok,
            claims_on_notify=not (options.burst or options.max_messages),
        )
        self.head_watcher = HeadWatcher(
            alias=self.alias, bounds=self.fetcher.bounds, stop=self.stopping
        )
        self.maintainer: Maintainer | None = None
        if conf.RETENTION_INTERVAL is not None and not options.burst:
            # Retention (core/_retention.py): one worker per interval does it, in this thread.
            self.maintainer = Maintainer(
                alias=self.alias,
                worker_id=self.worker_id,
                interval=conf.RETENTION_INTERVAL,
                stop=self.stopping,
            )
        self.heartbeat = Heartbeat(
            interval=self._beat_interval(),
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
        self.listener: Listener | None = None
        chores: list[Chore] = [StatusLine(self.worker_id, self.stats, self.executor)]
        if self.listening:
            self.listener, self.probe = compose_listening(
                alias=self.alias,
                channel=conf.NOTIFY_CHANNEL,
                worker_id=self.worker_id,
                fetcher=self.fetcher,
                heartbeat=self.heartbeat,
                wakeups=self.wakeups,
                instruments=self.instruments,
                stop=self.stopping,
                on_crash=self._on_crash,
            )
            chores.append(self.probe)
        chores.append(
            StaleReadyWarning(
                alias=self.alias, threshold=conf.STALE_READY_WARNING, stop=self.stopping
            )
        )
        self.main_loop = MainLoop(
            fetcher=self.fetcher,
            chores=chores,
            poll_interval=self.poll_interval,
            burst=options.burst,
            max_messages=options.max_messages,
            force=self.forced,
        )

    def _beat_interval(self) -> float:
        queues = self.fixed_queues or [self.conf.DEFAULT_QUEUE, *self.conf.QUEUES]
        return beat_interval(self.conf, queues, self.fetcher.vt)

    # -- control (any thread, or a signal handler) ---------------------------------------------

    def request_stop(self) -> None:
        """Graceful stop: no new messages, in-flight ones finish within the grace period."""
        if self.stopping.is_set():
            self.force_stop()
            return
        self.stopping.set()
        self.wakeups.wake()

    def force_stop(self) -> None:
        """Release unfinished leases now and exit non-zero."""
        self.stopping.set()
        self.forced.set()
        self.abort_io.set()
        self.wakeups.wake()

    def _on_crash(self, thread: str, exc: BaseException) -> None:
        """An unexpected error in ``thread``'s own machinery: stop the worker, exit 1.

        A worker missing a thread would look alive while it no longer archives, extends its
        leases or hears wake-ups; a supervisor restarts a worker that exits. Without a
        completer nothing more can be written: what it held is released at once.
        """
        with self._crash_lock:
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
            self.stopping.set()
            self.wakeups.wake()

    def _on_signal(self, signum: int) -> None:
        """SIGTERM or SIGINT, in the signal relay's thread (``signals.py``)."""
        name = signal.Signals(signum).name
        if self.stopping.is_set():
            logger.warning("Second %s: releasing unfinished messages now.", name)
            self.force_stop()
        else:
            logger.info(
                "%s: finishing %d in-flight messages (grace period %ss); send it again to stop now.",
                name,
                self.executor.in_flight(),
                self.grace_period,
            )
            self.request_stop()

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> int:
        self.main_thread = threading.current_thread()
        # Probes say "starting" until the worker is ready.
        endpoints.serve(self.servers, f"pgq_worker {self.worker_id}", self.options.http_host)
        stop_labelling = label_connections(self.worker_id, self.alias)
        # The main thread of its own process (pgq_worker), or a thread of a host (tests, embedding).
        own_process = threading.current_thread() is threading.main_thread()
        signals = None
        if self.options.install_signal_handlers and own_process:
            signals = SignalRelay(
                self._on_signal, (signal.SIGTERM, signal.SIGINT), on_crash=self._on_crash
            )
        try:
            self.unreachable = reach_database(
                self.alias, timeout=self.options.startup_timeout, stop=self.stopping
            )
            if self.unreachable is not None or self.stopping.is_set():
                return 1 if self.unreachable else 0
            try:
                self._start()
                if own_process:
                    _freeze_startup_objects()
                # Periodic schedules are known once the handlers' modules are imported.
                schedules = None if self.options.burst else PeriodicSchedules(self.alias)
                if self.main_loop.run(schedules if schedules else None):
                    self._exit_code = 1  # handler threads stuck: a fresh process is needed
            except Stopped:
                pass
            except Exception as exc:
                self._on_crash("main loop", exc)
            self._loop_ended = True
            return shut_down(self, self._exit_code)
        finally:
            if signals is not None:
                signals.close()
            stop_labelling()
            _execution.end_dedicated_session(connections[self.alias])
            if not own_process:
                # That thread's connection would outlive it otherwise.
                connections.close_all()
            for server in self.servers:
                server.stop()
            self.stopped.set()

    def _start(self) -> None:
        """Start every service but the main loop (the calling thread runs it)."""
        handlers = autodiscover()
        # Handlers are known now; their own visibility timeouts may be shorter.
        self.heartbeat.retime(self._beat_interval())
        self.completer.start()
        self.executor.start()
        for service in (self.head_watcher, self.maintainer, self.listener):
            if service is not None:
                service.start()
        if self.listener is not None and not self.listener.ready.wait(10):
            logger.warning("LISTEN connection not up yet; polling until it is.")
        retrying(
            "registering the worker",
            lambda: self.heartbeat.write_row(first=True),
            alias=self.alias,
            abort=self.stopping,
        )
        _log_ready(self, handlers)
        self.ready.set()

    # -- health (any thread) -------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        """True once the worker stopped taking messages."""
        return self.stopping.is_set() or self._loop_ended

    @property
    def taken(self) -> int:
        """Messages leased since start."""
        return self.fetcher.taken

    def _db_ok(self) -> None:
        self.db_ok_at = time.monotonic()

    def database_silence(self) -> float:
        """Seconds since the last successful database round trip."""
        return max(0.0, time.monotonic() - self.db_ok_at)


def _log_ready(worker: Worker, handlers: list[str]) -> None:
    """The start-up banner: what this worker serves and how."""
    options = worker.options
    logger.info(
        "pgq_worker %s ready: queues=%s%s concurrency=%d batch=%d visibility=%s "
        "poll=%ss listen=%s burst=%s grace=%ss handlers=%s",
        worker.worker_id,
        ",".join(worker.fixed_queues) or "all",
        f" (excluding {','.join(sorted(worker.excluded))})" if worker.excluded else "",
        worker.concurrency,
        worker.batch_size,
        f"{options.visibility_timeout}s" if options.visibility_timeout else "per queue",
        worker.poll_interval,
        "on" if worker.listening else "off",
        "on" if options.burst else "off",
        worker.grace_period,
        ",".join(handlers) or "none",
    )
    if not handlers:
        logger.warning(
            "No handlers are registered: every message will be dead-lettered as rejected. "
            "Put them in a 'handlers' or 'tasks' module of an installed app."
        )


def _freeze_startup_objects() -> None:
    """Move what exists after start-up (Django, the apps, the handlers: hundreds of thousands
    of objects that live as long as the process) out of the cyclic garbage collector's sight,
    so its collections scan only what the worker allocates since; nothing is lost: reference
    counting still frees what dies.
    Only in a worker process of its own (main thread), never in a host that embeds it."""
    gc.collect()
    gc.freeze()


def run_worker(options: WorkerOptions | None = None, **kwargs: Any) -> int:
    """Build a :class:`Worker` from options (or keyword arguments) and run it."""
    return Worker(options or WorkerOptions(**kwargs)).run()


__all__ = ["Worker", "WorkerOptions", "default_worker_id", "run_worker"]
