"""SIGTERM and SIGINT are acted on outside the signal handler (``signals.py``)."""

from __future__ import annotations

import signal
import threading

from django_pgqueue.worker.signals import SignalRelay


def test_a_signal_landing_while_its_thread_holds_the_lock_the_reaction_takes() -> None:
    # The worker's main loop spends its idle time in Event.wait and Event.clear, inside the
    # Event's lock; its reaction to SIGTERM sets that Event. Run in the signal handler, the
    # reaction would wait for the lock its own thread holds, for ever.
    stopping = threading.Event()
    seen: list[tuple[int, str]] = []

    def on_signal(signum: int) -> None:
        seen.append((signum, threading.current_thread().name))
        stopping.set()

    previous = signal.getsignal(signal.SIGTERM)
    relay = SignalRelay(on_signal, (signal.SIGTERM,))
    try:
        with stopping._cond:  # type: ignore[attr-defined]
            signal.raise_signal(signal.SIGTERM)  # the handler runs here, in this thread
        assert stopping.wait(5)
    finally:
        relay.close()

    assert seen == [(signal.SIGTERM, "signals")]
    assert signal.getsignal(signal.SIGTERM) is previous


def test_each_signal_is_relayed_in_order() -> None:
    seen: list[int] = []
    done = threading.Event()

    def on_signal(signum: int) -> None:
        seen.append(signum)
        if len(seen) == 2:
            done.set()

    relay = SignalRelay(on_signal, (signal.SIGTERM, signal.SIGINT))
    try:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        assert done.wait(5)
    finally:
        relay.close()

    assert seen == [signal.SIGINT, signal.SIGTERM]
