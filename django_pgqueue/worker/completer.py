"""The completer thread: archives finished messages and records failures in batches.

Handlers hand their outcome over and move on; this thread writes them with one statement
per batch (flushed every ``COMPLETION_FLUSH_INTERVAL`` or as soon as ``flush_size`` are
waiting), so processing does not pay a database round trip per message. Writes are fenced by
lease token: a message whose lease was lost is reported stale and left to its new owner.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core import transitions
from .db import Stopped, retrying
from .heartbeat import Stats
from .registry import notify_dead

if TYPE_CHECKING:
    from ..models import Message

logger = logging.getLogger("django_pgqueue.worker")


class Completer:
    def __init__(
        self,
        *,
        alias: str,
        flush_interval: float,
        flush_size: int,
        stats: Stats,
        abort: threading.Event,
        on_retried: Callable[[set[str]], None] | None = None,
    ) -> None:
        self.alias = alias
        self.flush_interval = flush_interval
        self.flush_size = flush_size
        self.stats = stats
        self.on_retried = on_retried
        self.abort = abort  # set -> stop retrying a write during an outage (forced exit)
        self._cond = threading.Condition()
        self._done_ids: list[int] = []
        self._done_tokens: list[uuid.UUID | None] = []
        self._done_results: list[str | None] = []
        # The queue of the first completed message buffered: the ack keeps its lease count
        # (a queue with a concurrency limit; transitions.complete_encoded).
        self._done_queue: str | None = None
        self._failed: list[tuple[transitions.FailedAttempt, Message]] = []
        self._oldest = 0.0
        self._busy = False
        self._kicked = False

    # -- called from handler threads -------------------------------------------------------

    def complete(self, message: Message, result_json: str | None) -> None:
        with self._cond:
            first = not self._done_ids and not self._failed
            if first:
                self._oldest = time.monotonic()
            if not self._done_ids:
                self._done_queue = message.queue
            self._done_ids.append(message.id)
            self._done_tokens.append(message.lease_token)
            self._done_results.append(result_json)
            # Wake the loop to start the flush clock (first) or flush a full batch now.
            if first or len(self._done_ids) >= self.flush_size:
                self._cond.notify()

    def fail(self, attempt: transitions.FailedAttempt, message: Message) -> None:
        with self._cond:
            if not self._done_ids and not self._failed:
                self._oldest = time.monotonic()
            self._failed.append((attempt, message))
            self._cond.notify()

    # -- the thread ------------------------------------------------------------------------

    def pending(self) -> int:
        with self._cond:
            return len(self._done_ids) + len(self._failed) + (1 if self._busy else 0)

    def wait_for_work(self, timeout: float) -> None:
        """Block until a batch is due or ``timeout`` passes (called by the completer loop)."""
        with self._cond:
            end = time.monotonic() + timeout
            while True:
                waiting = len(self._done_ids) + len(self._failed)
                now = time.monotonic()
                if waiting and (
                    waiting >= self.flush_size
                    or self._failed
                    or now - self._oldest >= self.flush_interval
                ):
                    return
                if now >= end or self._kicked:
                    self._kicked = False
                    return
                limit = end - now
                if waiting:
                    limit = min(limit, self._oldest + self.flush_interval - now)
                self._cond.wait(max(limit, 0.0005))

    def wake(self) -> None:
        """Make the completer loop flush now (shutdown, burst end)."""
        with self._cond:
            self._kicked = True
            self._cond.notify()

    def flush(self) -> None:
        """Write everything buffered so far (retrying through outages unless aborted)."""
        with self._cond:
            ids, tokens, results = self._done_ids, self._done_tokens, self._done_results
            queue = self._done_queue
            failed = self._failed
            self._done_ids, self._done_tokens, self._done_results = [], [], []
            self._failed = []
            self._busy = bool(ids or failed)
        try:
            if ids:
                self._archive(ids, tokens, results, queue)
            if failed:
                self._record_failures(failed)
        except Stopped:
            logger.warning(
                "Stopped before %d outcomes could be written; their leases will expire and "
                "the messages run again.",
                len(ids) + len(failed),
            )
        finally:
            with self._cond:
                self._busy = False

    def _archive(
        self,
        ids: list[int],
        tokens: list[uuid.UUID | None],
        results: list[str | None],
        queue: str | None,
    ) -> None:
        def write() -> list[int]:
            outcome = transitions.complete_encoded(
                ids, tokens, results, using=self.alias, queue=queue
            )
            return outcome.done

        done = retrying("archiving completed messages", write, alias=self.alias, abort=self.abort)
        self.stats.add(processed=len(done))
        if len(done) != len(ids):
            finished = set(done)
            stale = [i for i in ids if i not in finished]
            logger.warning(
                "%d completed messages were not archived because their lease was lost "
                "(expired and re-claimed, or moved by an operator): %s",
                len(stale),
                stale[:20],
            )

    def _record_failures(self, failed: list[tuple[transitions.FailedAttempt, Message]]) -> None:
        attempts = [a for a, _ in failed]
        outcome = retrying(
            "recording failed attempts",
            lambda: transitions.fail(attempts, using=self.alias),
            alias=self.alias,
            abort=self.abort,
        )
        self.stats.add(failed=len(failed), retried=len(outcome.retried), dead=len(outcome.buried))
        buried = set(outcome.buried)
        retried = set(outcome.retried)
        if retried and self.on_retried is not None:
            self.on_retried({m.queue for _, m in failed if m.id in retried})
        for attempt, message in failed:
            error = attempt.error
            if message.id in buried:
                notify_dead(message.task, message.id, str(attempt.final_reason))
                logger.warning(
                    "Message %s (%s on %s) dead-lettered: %s after %s of %s attempts: %s: %s",
                    message.id,
                    message.task,
                    message.queue,
                    attempt.final_reason,
                    message.attempts,
                    message.max_attempts,
                    error.get("type"),
                    error.get("message"),
                )
            elif message.id in retried:
                logger.info(
                    "Message %s (%s on %s) failed attempt %s of %s (%s: %s); retrying in %.1fs.",
                    message.id,
                    message.task,
                    message.queue,
                    message.attempts,
                    message.max_attempts,
                    error.get("type"),
                    error.get("message"),
                    attempt.retry_in or 0.0,
                )
        if outcome.stale:
            logger.warning(
                "%d failed attempts were not recorded because their lease was lost: %s",
                len(outcome.stale),
                outcome.stale[:20],
            )
