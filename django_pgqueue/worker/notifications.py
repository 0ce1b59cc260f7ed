"""What the worker does with a notification its listener hears (in the listener's thread).

A queue with ready messages: an idle worker claims them there (``Fetcher.claim_on_notify``),
a busy one wakes its main loop. Messages that fall due later: once the connection is quiet,
look up when, and wake the main loop then. A cancel notice for this worker: read the cancel
flags of what it holds (``Heartbeat.read_cancel_flags``). NOTIFY is only a hint: a payload
that names no queue is ignored.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable

from ..core._notify import CANCEL_PREFIX, cancel_payload, read_wake_payload
from ..core._validation import QueueNameError, validate_queue_name
from ..metrics.instruments import Instruments
from .chores import ListenerProbe
from .fetcher import Fetcher, due_at
from .heartbeat import Heartbeat
from .listener import Listener
from .service import OnCrash
from .wakeups import Wakeups

logger = logging.getLogger("django_pgqueue.worker")


class Notifications:
    """The listener's ``on_notify`` and ``on_reconnect``."""

    def __init__(
        self,
        *,
        worker_id: str,
        channel: str,
        fetcher: Fetcher,
        heartbeat: Heartbeat,
        wakeups: Wakeups,
        instruments: Instruments,
    ) -> None:
        self.channel = channel
        self.fetcher = fetcher
        self.heartbeat = heartbeat
        self.wakeups = wakeups
        self.instruments = instruments
        #: The listener whose connection deferred work runs on (set once it exists).
        self.listener: Listener | None = None
        self._cancel_notice = cancel_payload(worker_id)
        self._bad_notify_logged = False

    def on_notify(self, payload: str) -> None:
        if payload.startswith(CANCEL_PREFIX):
            if payload == self._cancel_notice:
                # Once the connection is quiet; several notices in a row make one read.
                self._defer("cancel", self.heartbeat.read_cancel_flags)
            return
        queue, later = read_wake_payload(payload)
        fetcher = self.fetcher
        if queue in fetcher.excluded or (
            fetcher.fixed_queues and queue not in fetcher.fixed_queues
        ):
            return
        try:
            validate_queue_name(queue)
        except QueueNameError:
            # Any role that may connect can NOTIFY this channel: a hint, never an order.
            self._ignore(payload)
            return
        if later:
            # Scheduled messages: find when the next one falls due, once the connection is
            # quiet; the main loop wakes then.
            self._defer(("due", queue), lambda: self._hint_next_due(queue))
            return
        if fetcher.claim_on_notify(queue):
            return
        self.wakeups.notified([queue])

    def on_reconnect(self) -> None:
        self.instruments.listener_reconnected()
        self.wakeups.catch_up()

    def _defer(self, key: Hashable, work: Callable[[], None]) -> None:
        assert self.listener is not None
        self.listener.defer(key, work)

    def _hint_next_due(self, queue: str) -> None:
        """In the listener thread: tell the main loop when ``queue``'s next message is due."""
        seconds = self.fetcher.seconds_to_next_due([queue])
        if seconds is not None:
            self.wakeups.due_at(due_at(seconds))

    def _ignore(self, payload: str) -> None:
        level = logging.DEBUG if self._bad_notify_logged else logging.WARNING
        self._bad_notify_logged = True
        logger.log(
            level,
            "Ignored a notification on channel %r that names no queue: %r%s",
            self.channel,
            payload[:100],
            "" if level == logging.DEBUG else " (further ones are logged at DEBUG).",
        )


def compose_listening(
    *,
    alias: str,
    channel: str,
    worker_id: str,
    fetcher: Fetcher,
    heartbeat: Heartbeat,
    wakeups: Wakeups,
    instruments: Instruments,
    stop: threading.Event,
    on_crash: OnCrash,
) -> tuple[Listener, ListenerProbe]:
    """The listener (not started yet), wired to what its notifications mean, and the chore
    that probes it."""
    notifications = Notifications(
        worker_id=worker_id,
        channel=channel,
        fetcher=fetcher,
        heartbeat=heartbeat,
        wakeups=wakeups,
        instruments=instruments,
    )
    listener = notifications.listener = Listener(
        alias=alias,
        channel=channel,
        application_name=f"pgq_worker:{worker_id}:listener",
        on_notify=notifications.on_notify,
        on_reconnect=notifications.on_reconnect,
        on_probe=lambda payload: None,  # the probe's, below
        on_crash=on_crash,
    )
    probe = ListenerProbe(
        alias=alias, channel=channel, worker_id=worker_id, listener=listener, stop=stop
    )
    listener.on_probe = probe.heard
    return listener, probe
