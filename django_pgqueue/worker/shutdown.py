"""How a worker stops: release what has not started, give running handlers the grace period,
release what is still running after it, write what is left, unregister.

A graceful stop (SIGTERM, ``--burst`` done, an internal error) drains; a forced one (a second
signal, a failed completer) releases at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core import transitions
from . import heartbeat
from .db import Stopped, retrying

if TYPE_CHECKING:
    from .runner import Worker

logger = logging.getLogger("django_pgqueue.worker")


def shut_down(worker: Worker, code: int) -> int:
    """Stop ``worker``'s parts in order; returns the exit code (``code``, or 1 when some
    messages could not finish)."""
    executor, completer = worker.executor, worker.completer
    if worker.listener is not None:
        worker.listener.stop()
    with worker.fetcher.lock:  # a claim in the listener thread finishes dispatching first
        queued = executor.take_queued()
    if queued:
        release(worker, [j.message for j in queued], "not started")
    _grace(worker)
    # After an internal error, a message that ran keeps its attempt: were it what breaks
    # the worker, it must end dead after its attempts, not run again and again.
    reset_attempt = worker.crashed is None
    if executor.in_flight():
        code = 1
        abandoned = executor.abandon_running()
        worker.abort_io.set()  # do not hang on an outage now; leases expire by themselves
        release(worker, [j.message for j in abandoned], "unfinished", reset_attempt=reset_attempt)
    if worker.crashed is not None and worker.crashed.startswith("completer"):
        unwritten = completer.take_unwritten()
        if unwritten:
            release(worker, unwritten, "finished but unrecorded", reset_attempt=False)
    completer.stop()
    completer.wake()
    completer.join(None if code == 0 else 2.0)
    try:
        retrying(
            "unregistering the worker",
            lambda: heartbeat.forget(alias=worker.alias, worker_id=worker.worker_id),
            alias=worker.alias,
            # Tried once: during an outage the row is left to go stale.
            abort=worker.stopping,
        )
    except Stopped:
        pass
    if worker.health_file is not None:
        worker.health_file.unlink(missing_ok=True)
    executor.stop(wait=1.0 if code == 0 else 0.0)
    if worker.listener is not None:
        worker.listener.join(0.3)  # a daemon: it closes its connection itself
    stats = worker.stats
    logger.info(
        "pgq_worker %s stopped%s: %d processed, %d retried, %d dead.",
        worker.worker_id,
        "" if code == 0 else " without finishing everything",
        stats.processed,
        stats.retried,
        stats.dead,
    )
    return code


def _grace(worker: Worker) -> None:
    """Let running handlers finish within the grace period (sync deadlines still apply)."""
    executor, wakeups = worker.executor, worker.wakeups
    deadline = time.monotonic() + worker.grace_period
    wakeups.want_capacity = True  # a handler finishing wakes this wait
    while executor.in_flight() and not worker.forced.is_set():
        now = time.monotonic()
        if now >= deadline:
            logger.warning(
                "Grace period of %ss is over with %d messages still running.",
                worker.grace_period,
                executor.in_flight(),
            )
            return
        next_deadline = executor.expire_overdue(now)
        limit = deadline if next_deadline is None else min(deadline, next_deadline)
        wakeups.wait(min(max(0.0, limit - now), 0.5))


def release(
    worker: Worker,
    messages: Sequence[transitions.LeaseRef],
    what: str,
    *,
    reset_attempt: bool = True,
) -> None:
    """Give ``messages``' leases back so they run again at once (logged)."""
    try:
        outcome = retrying(
            "releasing leases",
            lambda: transitions.release(messages, reset_attempt=reset_attempt, using=worker.alias),
            alias=worker.alias,
            # Tried at least once; a second signal stops retrying through an outage.
            abort=worker.abort_io,
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
