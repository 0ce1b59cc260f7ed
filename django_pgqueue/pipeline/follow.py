"""``pgq_pipeline export --every SECONDS``: one export pass after another in one process.

Every pass of ``pgq_pipeline export`` run on its own pays for a JVM and a SparkSession
(seconds of CPU, most of what a small pass costs). Repeated passes here share one session,
so an export that keeps up with a living archive costs what its rows cost.

A pass that finds the destination busy, loses its lease or meets a database error is
reported and tried again at the next interval: each pass resumes from the committed ranges,
so nothing is lost or written twice. Any other error ends the command. The first SIGTERM or
SIGINT lets the running pass finish and then stops; a second one interrupts the pass (the
next run takes over from it, as after a crash).
"""

from __future__ import annotations

import _thread
import signal
import threading
from collections.abc import Callable

from django.db import DatabaseError, connections

from ..exceptions import DestinationBusy, LeaseLost, PipelineError
from ..worker.signals import SignalRelay

#: Errors a later pass can get past: another run's lease, a lost lease, the database away.
RETRIED = (DestinationBusy, LeaseLost, DatabaseError)


def check_every(seconds: float) -> float:
    if not 0 < seconds < float("inf"):
        raise PipelineError(f"--every takes a number of seconds > 0 (e.g. 30), got {seconds:g}.")
    return seconds


def follow(
    export_pass: Callable[[], int],
    every: float,
    *,
    alias: str,
    report: Callable[[str], None],
    stop: threading.Event | None = None,
) -> int:
    """Run ``export_pass`` every ``every`` seconds until ``stop`` is set (by the first
    SIGTERM or SIGINT when called from the main thread); returns 0 once stopped."""
    check_every(every)
    stop = stop or threading.Event()
    relay = _stop_on_signals(stop, report) if _in_main_thread() else None
    try:
        while not stop.is_set():
            connections[alias].close_if_unusable_or_obsolete()
            try:
                export_pass()
            except RETRIED as exc:
                reason = " ".join(str(exc).split()) or type(exc).__name__
                report(f"export: pass failed ({reason}); next pass in {every:g} s")
                if isinstance(exc, DatabaseError):
                    connections[alias].close()
            stop.wait(every)
    finally:
        if relay is not None:
            relay.close()
    return 0


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _stop_on_signals(stop: threading.Event, report: Callable[[str], None]) -> SignalRelay:
    def on_signal(signum: int) -> None:
        if stop.is_set():
            _thread.interrupt_main()  # the second signal: stop the pass itself
            return
        stop.set()
        report(f"export: {signal.Signals(signum).name}: stopping after the running pass")

    def on_crash(where: str, exc: BaseException) -> None:
        report(f"export: signal handling failed ({type(exc).__name__}: {exc})")

    return SignalRelay(on_signal, (signal.SIGTERM, signal.SIGINT), on_crash)
