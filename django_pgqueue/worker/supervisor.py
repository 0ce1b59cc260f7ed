"""``pgq_worker --processes N``: one supervisor process, N worker processes.

**How children start.** Each child is a new interpreter running the same management command
(``python -m django pgq_worker ... --child-of <supervisor pid>``), not a ``fork()`` of the
supervisor. A fork would copy a process that has Django set up, maybe database connections
(psycopg connections and their sockets must never be shared between processes), threads
(the HTTP endpoints, the signal relay) whose locks a fork can copy held, and the supervisor's
signal handlers. A fresh interpreter starts clean: its own connections, threads and
handlers, the same start-up as a worker run alone, on every platform. The price is about a
second of start-up per child, paid at start and at each replacement.

**What the supervisor does** (in the main thread: the kernel's parent-death signal of a child
follows the thread that started it, so that thread must live as long as the supervisor):

- starts the children, each a full worker with its own worker id, ``<id>.<n>`` (``n`` counts
  the children started, so a replacement never reuses a dead child's id);
- replaces a child that exits: at once after a recycle (:data:`child.RECYCLED`) or an
  unasked-for clean exit; after a crash (any other exit, or a signal) with a delay that
  doubles with each crash in a row (:func:`restart_delay`), logging once why it died (exit
  code or signal name, how long it ran). A child that ran :data:`STABLE_AFTER` seconds
  starts a new streak;
- on SIGTERM/SIGINT forwards SIGTERM once to every child (a second signal: again, which
  makes them release at once), waits for them until the grace period and
  :data:`DRAIN_SLACK` have passed, then SIGKILLs what is left. Exits 0 when every child
  drained cleanly (exit 0), else 1. With ``--burst`` it exits when every child is done;
- serves one ``--metrics-port`` (the children's expositions summed) and one
  ``--health-port`` (its own view of the children, plus each child's probe):
  ``group_endpoints.py``.

Children run in a process group of their own, so a Ctrl-C in a terminal reaches only the
supervisor, which forwards it: each child gets one signal, not two.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import child
from .group_endpoints import GroupEndpoints
from .signals import SignalRelay

logger = logging.getLogger("django_pgqueue.worker")

#: Seconds past the grace period the supervisor waits for draining children (their last
#: writes, unregistering) before it SIGKILLs them.
DRAIN_SLACK = 10.0
#: A child that ran at least this long before it crashed starts a new crash streak.
STABLE_AFTER = 60.0
#: First and largest delay before a crashed child is started again (seconds).
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
#: Crashes in a row, each within STABLE_AFTER of its start, that make a crash loop.
CRASH_LOOP = 3
#: How often the supervisor looks at its children when nothing else wakes it.
TICK = 0.1


def restart_delay(streak: int) -> float:
    """Seconds before the ``streak``-th crash in a row is restarted: at once for the first,
    then 1, 2, 4 ... up to BACKOFF_MAX."""
    if streak <= 1:
        return 0.0
    return float(min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (streak - 2)))


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class SupervisorOptions:
    processes: int
    #: The supervisor's id; children are ``<worker_id>.<n>``.
    worker_id: str
    #: The flags every child gets (queues, concurrency, recycling bounds...).
    child_args: list[str]
    grace_period: float
    burst: bool = False
    metrics_port: int | None = None
    health_port: int | None = None
    http_host: str = "127.0.0.1"
    #: What a child recycles after, for the log lines (e.g. "--max-tasks-per-child 100").
    recycling: str = ""


@dataclass
class Slot:
    """One of the N places for a child, and the child in it (if one runs)."""

    number: int
    proc: subprocess.Popen[bytes] | None = None
    worker_id: str = ""
    started_at: float = 0.0
    endpoints_file: Path | None = None
    port: int | None = None
    #: Crashes in a row; 0 after a clean start or a recycle.
    streak: int = 0
    #: When the next child may start (after a crash's backoff).
    start_at: float = 0.0
    #: Why the slot is empty, for the health probes ("" while a child runs).
    vacancy: str = "starting"
    #: The slot's child finished its work (``--burst``): not replaced.
    done: bool = False
    restarts: int = 0
    recycles: int = 0
    history: list[int] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.proc is not None


class Supervisor:
    def __init__(self, options: SupervisorOptions) -> None:
        if options.processes < 1:
            raise ValueError("--processes must be a whole number >= 1")
        self.options = options
        self.worker_id = options.worker_id
        self.slots = [Slot(n) for n in range(1, options.processes + 1)]
        self._spawned = 0
        #: Guards the slots, which the endpoints' thread reads.
        self.lock = threading.Lock()
        self._wake = threading.Event()
        self._signals: list[int] = []
        self._signals_acted = 0
        self.stopping = False
        self._deadline: float | None = None
        self._clean = True
        self._dir = Path(tempfile.mkdtemp(prefix="pgq-supervisor-"))
        try:
            self.endpoints = GroupEndpoints(self)
        except ValueError:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    # -- health (the endpoints' thread) --------------------------------------------------------

    def problems(self, *, readiness: bool) -> list[str]:
        """What the supervisor itself knows is wrong (no child is asked)."""
        problems: list[str] = []
        with self.lock:
            for slot in self.slots:
                if slot.streak >= CRASH_LOOP:
                    problems.append(
                        f"child {slot.number} is in a crash loop: it died {slot.streak} times "
                        f"in a row, each within {STABLE_AFTER:g}s of its start"
                    )
                elif not slot.running and not slot.done and slot.streak:
                    problems.append(f"child {slot.number} is restarting: {slot.vacancy}")
                elif readiness and not slot.running and not slot.done:
                    problems.append(f"child {slot.number} is {slot.vacancy}")
            if readiness and self.stopping:
                problems.append("draining")
        return problems

    # -- control -------------------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        with self.lock:
            self._signals.append(signum)
        self._wake.set()

    def _on_crash(self, thread: str, exc: BaseException) -> None:
        logger.critical("Internal error in the supervisor's %s thread", thread, exc_info=exc)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> int:
        relay = None
        if threading.current_thread() is threading.main_thread():
            relay = SignalRelay(self._on_signal, (signal.SIGTERM, signal.SIGINT), self._on_crash)
        try:
            self.endpoints.start()
            logger.info(
                "pgq_worker supervisor %s (pid %d) starting %d worker processes%s",
                self.worker_id,
                os.getpid(),
                len(self.slots),
                f"; recycling: {self.options.recycling}" if self.options.recycling else "",
            )
            return self._supervise()
        finally:
            # Children still running here (only after an internal error: the loop waits for
            # them) get their parent-death SIGTERM when this process exits, and drain.
            if relay is not None:
                relay.close()
            self.endpoints.stop()
            shutil.rmtree(self._dir, ignore_errors=True)

    def _supervise(self) -> int:
        while True:
            now = time.monotonic()
            self._act_on_signals(now)
            with self.lock:
                for slot in self.slots:
                    if slot.running and slot.streak and now - slot.started_at >= STABLE_AFTER:
                        slot.streak = 0  # it runs: the crash streak is over
            for slot in self.slots:
                if slot.proc is not None:
                    code = slot.proc.poll()
                    if code is not None:
                        self._exited(slot, code, now)
            if self.stopping or self.options.burst:
                if not any(s.running for s in self.slots) and (
                    self.stopping or all(s.done for s in self.slots)
                ):
                    break
            if self.stopping:
                assert self._deadline is not None
                if now >= self._deadline:
                    self._kill_stragglers()
            else:
                for slot in self.slots:
                    if not slot.running and not slot.done and now >= slot.start_at:
                        self._spawn(slot)
            self._wake.wait(TICK)
            self._wake.clear()
        code = 0 if self._clean else 1
        logger.info(
            "pgq_worker supervisor %s stopped (exit %d): %d restarts after crashes, %d recycles.",
            self.worker_id,
            code,
            sum(s.restarts for s in self.slots),
            sum(s.recycles for s in self.slots),
        )
        return code

    def _act_on_signals(self, now: float) -> None:
        with self.lock:
            pending = self._signals[self._signals_acted :]
            self._signals_acted = len(self._signals)
        for signum in pending:
            name = signal.Signals(signum).name
            if not self.stopping:
                self.stopping = True
                self._deadline = now + self.options.grace_period + DRAIN_SLACK
                running = [s for s in self.slots if s.running]
                logger.info(
                    "%s: draining %d worker processes (grace period %ss); send it again to "
                    "make them release their messages now.",
                    name,
                    len(running),
                    self.options.grace_period,
                )
            else:
                logger.warning("Second %s: the worker processes release their messages now.", name)
                self._clean = False
            for slot in self.slots:
                if slot.proc is not None and slot.proc.poll() is None:
                    slot.proc.send_signal(signal.SIGTERM)

    def _kill_stragglers(self) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                logger.error(
                    "Worker process %s (pid %d) still running %gs after the grace period: "
                    "SIGKILL (its leases expire after their visibility timeout).",
                    slot.worker_id,
                    slot.proc.pid,
                    DRAIN_SLACK,
                )
                slot.proc.kill()
        self._clean = False

    def _spawn(self, slot: Slot) -> None:
        self._spawned += 1
        worker_id = f"{self.worker_id}.{self._spawned}"
        endpoints_file = self._dir / f"{self._spawned}.json"
        args = [*self.options.child_args, "--worker-id", worker_id, "--child-of", str(os.getpid())]
        if self.options.metrics_port is not None or self.options.health_port is not None:
            args += ["--child-endpoints", str(endpoints_file)]
        proc = subprocess.Popen(
            child_command(args),
            env=child_environment(),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        with self.lock:
            slot.proc = proc
            slot.worker_id = worker_id
            slot.started_at = time.monotonic()
            slot.endpoints_file = endpoints_file
            slot.port = None
            slot.vacancy = ""
        logger.info(
            "Started worker process %s (pid %d) in slot %d.", worker_id, proc.pid, slot.number
        )

    def _exited(self, slot: Slot, code: int, now: float) -> None:
        ran = now - slot.started_at
        worker_id, pid = slot.worker_id, slot.proc.pid if slot.proc else 0
        self.endpoints.retire(worker_id)
        with self.lock:
            slot.proc = None
            slot.port = None
            slot.history.append(code)
            if self.stopping:
                # Killed by the forwarded SIGTERM itself: it came before the child set up
                # its handler, so before it could lease anything.
                if code not in (0, child.RECYCLED, -signal.SIGTERM):
                    self._clean = False
                    logger.warning(
                        "Worker process %s (pid %d) did not drain cleanly: %s.",
                        worker_id,
                        pid,
                        describe_exit(code),
                    )
                return
            if code == child.RECYCLED:
                slot.streak, slot.start_at, slot.vacancy = 0, now, "starting after a recycle"
                slot.recycles += 1
                logger.info(
                    "Worker process %s (pid %d) recycled after %.1fs (%s); starting its "
                    "replacement.",
                    worker_id,
                    pid,
                    ran,
                    self.options.recycling,
                )
                return
            if code == 0:
                if self.options.burst:
                    slot.done, slot.vacancy = True, "done"
                    logger.info("Worker process %s (pid %d) is done (--burst).", worker_id, pid)
                else:
                    slot.streak, slot.start_at, slot.vacancy = 0, now, "starting"
                    logger.warning(
                        "Worker process %s (pid %d) exited 0 after %.1fs without being asked "
                        "(a signal sent to it alone?); starting its replacement.",
                        worker_id,
                        pid,
                        ran,
                    )
                return
            slot.streak = slot.streak + 1 if ran < STABLE_AFTER else 1
            delay = restart_delay(slot.streak)
            slot.start_at = now + delay
            slot.restarts += 1
            slot.vacancy = f"{worker_id} died ({describe_exit(code)}) after {ran:.1f}s"
            logger.error(
                "Worker process %s (pid %d) died: %s after running %.1fs; %s (crash %d in a "
                "row%s).",
                worker_id,
                pid,
                describe_exit(code),
                ran,
                f"restarting it in {delay:g}s" if delay else "restarting it now",
                slot.streak,
                ": crash loop" if slot.streak >= CRASH_LOOP else "",
            )


def child_command(args: Sequence[str]) -> list[str]:
    """The command line of a child: this interpreter, the same management command."""
    return [sys.executable, "-m", "django", "pgq_worker", *args]


def child_environment() -> dict[str, str]:
    """The supervisor's environment, with what makes ``python -m django`` find the same
    project: the settings module, and the supervisor's script folder (``manage.py``'s, on
    ``sys.path`` only through how it was started) on ``PYTHONPATH``."""
    from django.conf import settings

    env = dict(os.environ)
    module = getattr(settings, "SETTINGS_MODULE", None)
    if module:
        env["DJANGO_SETTINGS_MODULE"] = module
    first = sys.path[0] if sys.path else ""
    script_dir = os.path.abspath(first or os.getcwd())
    paths = [script_dir, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env
