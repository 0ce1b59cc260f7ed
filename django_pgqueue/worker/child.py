"""A worker process run by a supervisor (``pgq_worker --processes N``): the child's side.

A child is a whole worker, as ``pgq_worker`` runs one alone, plus three duties:

- **it does not outlive its supervisor.** On Linux the kernel signals it when the supervisor
  dies (``prctl(PR_SET_PDEATHSIG)``, SIGHUP, which it turns into one SIGTERM; should the
  supervisor be gone already when the child makes that call, the child sees it in
  ``os.getppid()`` and signals itself); where ``prctl`` is missing, a thread compares
  ``os.getppid()`` with the supervisor's pid every second and sends the child SIGTERM itself.
  SIGTERM is the worker's graceful stop: it hands back what it had not started, finishes what
  runs within the grace period and exits, so a SIGKILLed supervisor leaves no lease held
  longer than the grace period;
- **it says where its endpoints are.** With a group ``--metrics-port`` or
  ``--health-port`` it serves both on one private port of ``127.0.0.1`` (any free one) and
  writes that port to the file the supervisor named (:func:`report_endpoints`);
- **it recycles itself** past ``--max-tasks-per-child`` messages (the worker's own
  ``max_messages`` count: it claims no more than that, finishes them and stops) or
  ``--max-memory-per-child`` MiB of resident memory (:class:`MemoryBound`: a graceful stop,
  between messages), and then exits :data:`RECYCLED` so the supervisor replaces it at once
  and logs a recycle, not a crash.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger("django_pgqueue.worker")

#: The exit code of a child that stopped because it reached its recycling bound
#: (``EX_TEMPFAIL``: done for now, start another).
RECYCLED = 75
#: Seconds between two looks at the parent's pid and at the resident memory.
WATCH_INTERVAL = 1.0

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """SIGTERM to this process, once, when ``parent_pid`` exits: by the kernel on Linux,
    else by a thread watching ``os.getppid()`` (one signal only: a second one would make the
    worker release what runs instead of finishing it)."""
    # The kernel sends the parent-death signal each time the thread that is the child's parent
    # exits: when a multi-threaded supervisor is killed, the child is handed to its other
    # threads in turn and may hear it more than once. So it is SIGHUP, turned into the one
    # SIGTERM here, never SIGTERM itself (a second SIGTERM releases what runs).
    told = threading.Event()

    def parent_died(signum: int, frame: object) -> None:
        if not told.is_set():
            told.set()
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGHUP, parent_died)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGHUP, 0, 0, 0) == 0
    except (OSError, AttributeError):
        armed = False  # not Linux
    if armed:
        if os.getppid() != parent_pid:  # it died before the call: the kernel will not tell
            _parent_gone(parent_pid)
        return
    threading.Thread(
        target=_watch_parent, args=(parent_pid,), name="parent watch", daemon=True
    ).start()


def _watch_parent(parent_pid: int) -> None:
    stop = threading.Event()
    while os.getppid() == parent_pid:
        stop.wait(WATCH_INTERVAL)
    _parent_gone(parent_pid)


def _parent_gone(parent_pid: int) -> None:
    logger.warning("The supervisor (pid %d) is gone: stopping this worker.", parent_pid)
    os.kill(os.getpid(), signal.SIGTERM)


def report_endpoints(path: str | Path, port: int) -> None:
    """Tell the supervisor this child's private port (written whole, then renamed)."""
    target = Path(path)
    partial = target.with_suffix(".tmp")
    partial.write_text(json.dumps({"pid": os.getpid(), "port": port}))
    partial.replace(target)


def read_endpoints(path: str | Path) -> int | None:
    """The port a child reported in ``path``, or None before it did."""
    try:
        return int(json.loads(Path(path).read_text())["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resident_mib() -> float:
    """This process's resident set size in MiB (``/proc/self/statm``)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)


def check_memory_bound_supported() -> None:
    """Raise ValueError where ``--max-memory-per-child`` cannot be measured."""
    try:
        resident_mib()
    except (OSError, ValueError, IndexError) as exc:
        raise ValueError(f"--max-memory-per-child needs /proc/self/statm (Linux): {exc}") from exc


class MemoryBound:
    """Calls ``stop`` once (a graceful stop) when the resident memory passes ``limit_mib``."""

    def __init__(self, limit_mib: int, stop: Callable[[], None]) -> None:
        self.limit_mib = limit_mib
        self._stop = stop
        self.reached_mib: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="memory bound", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(WATCH_INTERVAL):
            rss = resident_mib()
            if rss > self.limit_mib:
                self.reached_mib = rss
                logger.info(
                    "Resident memory %.0f MiB is past --max-memory-per-child %d MiB: "
                    "finishing what this worker holds, then recycling it.",
                    rss,
                    self.limit_mib,
                )
                self._stop()
                return
