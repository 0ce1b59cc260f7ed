"""SIGTERM and SIGINT are acted on outside the signal handler (``signals.py``)."""

from __future__ import annotations

import signal
import threading

from django_pgqueue.worker.signals import SignalRelay


def unexpected(thread: str, exc: BaseException) -> None:
    raise AssertionError(f"{thread} crashed: {exc!r}")


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
    relay = SignalRelay(on_signal, (signal.SIGTERM,), on_crash=unexpected)
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

    relay = SignalRelay(on_signal, (signal.SIGTERM, signal.SIGINT), on_crash=unexpected)
    try:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        assert done.wait(5)
    finally:
        relay.close()

    assert seen == [signal.SIGINT, signal.SIGTERM]


def test_an_error_in_the_reaction_is_reported_and_the_next_signal_still_acted_on() -> None:
    crashes: list[tuple[str, str, str]] = []
    seen: list[int] = []
    done = threading.Event()

    def on_signal(signum: int) -> None:
        seen.append(signum)
        if len(seen) == 1:
            raise RuntimeError("logging is broken")
        done.set()

    def on_crash(thread: str, exc: BaseException) -> None:
        crashes.append((thread, type(exc).__name__, threading.current_thread().name))

    relay = SignalRelay(on_signal, (signal.SIGTERM,), on_crash=on_crash)
    try:
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        assert done.wait(5)
    finally:
        relay.close()

    assert crashes == [("signals", "RuntimeError", "signals")]
    assert seen == [signal.SIGTERM, signal.SIGTERM]
