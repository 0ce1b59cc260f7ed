"""SIGTERM and SIGINT, acted on outside the signal handler.

Python runs a signal handler in the main thread between two bytecodes, possibly while that
thread holds a lock (an ``Event``'s, while it waits or clears it). A handler that takes the
same lock waits for itself forever. The handler here only puts the signal's number on a
``SimpleQueue``, which is safe to call from a signal handler; a thread of its own takes it
from there and calls ``on_signal``, where taking locks is safe. An error in ``on_signal``
goes to ``on_crash`` and the thread carries on: a later signal is still acted on.
"""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Callable
from types import FrameType


class SignalRelay:
    """Installs itself for ``signals`` until :meth:`close`, which puts back what was there."""

    def __init__(
        self,
        on_signal: Callable[[int], None],
        signals: tuple[int, ...],
        on_crash: Callable[[str, BaseException], None],
    ) -> None:
        self._on_signal = on_signal
        self._on_crash = on_crash
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._relay, name="signals", daemon=True)
        self._thread.start()
        self._previous = {signum: signal.signal(signum, self.handler) for signum in signals}

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self._queue.put(signum)

    def _relay(self) -> None:
        while (signum := self._queue.get()) is not None:
            try:
                self._on_signal(signum)
            except Exception as exc:
                self._on_crash("signals", exc)

    def close(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._queue.put(None)
        self._thread.join(1.0)
