"""How the completer (``completer.py``) writes each kind of outcome: a batch of results
archived, of failed attempts recorded (a retry, or the dead table), of snoozes; with their
log lines, counts and instruments.

One statement per kind and batch, fenced by lease token: a message whose lease was lost is
reported stale and left to its new owner. Should the database refuse a batch's data, the
batch is written row by row so that only the row at fault is affected: a result that cannot
be stored sends its message to the dead table with the reason; an error entry that cannot be
stored is recorded without its text; a snooze refused (a cancel, too many snoozes) buries its
message.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import DataError, connections

from ..core import _execution, transitions
from ..core._log_fields import batch_fields, message_fields
from ..core._registry import notify_dead
from ..core._validation import printable
from ..exceptions import ResultNotSerializable, SnoozeLimitExceeded
from ..metrics.instruments import Instruments
from ..models import DeadReason
from .db import first_line, retrying
from .heartbeat import Stats
from .storable import log_excerpt, storable_text

if TYPE_CHECKING:
    from ..models import Message

logger = logging.getLogger("django_pgqueue.worker")


@dataclasses.dataclass(frozen=True, slots=True)
class Snooze:
    """A handler's ``Snooze(seconds)``, waiting to be written."""

    message: Message
    seconds: float
    max_snoozes: int


class OutcomeWriter:
    """Writes batches of outcomes (in the completer's thread), retrying through outages
    until ``abort`` is set."""

    def __init__(
        self,
        *,
        alias: str,
        stats: Stats,
        abort: threading.Event,
        instruments: Instruments,
        on_retried: Callable[[set[str]], None] | None,
        log_error_chars: int,
    ) -> None:
        self.alias = alias
        self.stats = stats
        self.abort = abort
        self.instruments = instruments
        #: Called with the queues of messages that wait again (retried or snoozed).
        self.on_retried = on_retried
        self.log_error_chars = log_error_chars

    def archive(self, done: list[Message], results: list[str | None]) -> None:
        """Archive finished messages with their results."""
        ids = [m.id for m in done]
        refused: list[Message] = []
        try:
            archived = self._write_completions(ids, [m.lease_token for m in done], results)
        except DataError as exc:
            # Not an outage (retrying() rides those out): the data of some row. Find it, so
            # that its batch-mates are archived all the same.
            logger.error(
                "The database refused a batch of %d results (%s); archiving them one by one.",
                len(done),
                first_line(exc),
            )
            archived = []
            for message, result in zip(done, results, strict=True):
                try:
                    archived += self._write_completions(
                        [message.id], [message.lease_token], [result]
                    )
                except DataError as row_exc:
                    refused.append(message)
                    self.record_failures([(self._refusal(message, row_exc), message)])
        self.stats.add(processed=len(archived))
        if len(archived) == len(done):
            self.instruments.archived([(m.queue, m.task) for m in done])
        else:
            written = set(archived)
            self.instruments.archived([(m.queue, m.task) for m in done if m.id in written])
        if len(archived) + len(refused) != len(ids):
            finished = {*archived, *(m.id for m in refused)}
            _lost_leases(
                [i for i in ids if i not in finished],
                "completed messages were not archived",
                " (expired and re-claimed, or moved by an operator)",
            )

    def _write_completions(
        self,
        ids: list[int],
        tokens: list[uuid.UUID | None],
        results: list[str | None],
    ) -> list[int]:
        def write() -> list[int]:
            # This thread's connection runs only the worker's transitions.
            _execution.dedicate_to_acks(connections[self.alias])
            outcome = transitions.complete_encoded(ids, tokens, results, using=self.alias)
            return outcome.done

        return retrying("archiving completed messages", write, alias=self.alias, abort=self.abort)

    @staticmethod
    def _refusal(message: Message, exc: BaseException) -> transitions.FailedAttempt:
        """The failure that buries a message whose result the database refused to store."""
        error = transitions.error_entry(
            attempt=message.attempts,
            worker_id=message.leased_by,
            type_name=f"{ResultNotSerializable.__module__}.{ResultNotSerializable.__qualname__}",
            message=storable_text(
                f"the database refused to store the handler's result: {first_line(exc)}"
            ),
        )
        return transitions.FailedAttempt(
            lease=message, error=error, retry_in=None, final_reason=DeadReason.ERROR
        )

    def _write_failures(self, attempts: list[transitions.FailedAttempt]) -> transitions.Outcome:
        return retrying(
            "recording failed attempts",
            lambda: transitions.fail(attempts, using=self.alias),
            alias=self.alias,
            abort=self.abort,
        )

    def _write_failures_one_by_one(
        self, attempts: list[transitions.FailedAttempt]
    ) -> transitions.Outcome:
        total = transitions.Outcome()
        for attempt in attempts:
            try:
                outcome = self._write_failures([attempt])
            except DataError as exc:
                # The attempt counts all the same; only its refused text is left out.
                error = {
                    **attempt.error,
                    "type": storable_text(str(attempt.error.get("type"))),
                    "message": f"the error text could not be stored: {first_line(exc)}",
                    "traceback": "",
                }
                outcome = self._write_failures([dataclasses.replace(attempt, error=error)])
            total.done += outcome.done
            total.stale += outcome.stale
            total.retried += outcome.retried
            total.buried += outcome.buried
            total.dead_reasons.update(outcome.dead_reasons)
        return total

    def record_failures(self, failed: list[tuple[transitions.FailedAttempt, Message]]) -> None:
        """Record failed attempts: each message retried later, or dead-lettered."""
        attempts = [a for a, _ in failed]
        try:
            outcome = self._write_failures(attempts)
        except DataError as exc:
            logger.error(
                "The database refused a batch of %d failed attempts (%s); recording them one "
                "by one.",
                len(attempts),
                first_line(exc),
            )
            outcome = self._write_failures_one_by_one(attempts)
        self.stats.add(failed=len(failed), retried=len(outcome.retried), dead=len(outcome.buried))
        # The reason the database buried each with: cancel() overrides the attempt's.
        buried = outcome.dead_reasons
        retried = set(outcome.retried)
        self.instruments.failures(
            failed=[(m.queue, m.task) for _, m in failed],
            retried=[(m.queue, m.task) for _, m in failed if m.id in retried],
            dead=[(m.queue, m.task, buried[m.id]) for _, m in failed if m.id in buried],
        )
        if retried and self.on_retried is not None:
            self.on_retried({m.queue for _, m in failed if m.id in retried})
        for attempt, message in failed:
            error = attempt.error
            if message.id in buried:
                notify_dead(message.task, message.id, buried[message.id])
                logger.warning(
                    "Message %s (%s on %s) dead-lettered: %s after %s of %s attempts: %s%s",
                    message.id,
                    printable(message.task),
                    message.queue,
                    buried[message.id],
                    message.attempts,
                    message.max_attempts,
                    error.get("type"),
                    self._excerpt(error),
                    extra=message_fields(message),
                )
            elif message.id in retried:
                logger.info(
                    "Message %s (%s on %s) failed attempt %s of %s (%s%s); retrying in %.1fs.",
                    message.id,
                    printable(message.task),
                    message.queue,
                    message.attempts,
                    message.max_attempts,
                    error.get("type"),
                    self._excerpt(error),
                    attempt.retry_in or 0.0,
                    extra=message_fields(message),
                )
        if outcome.stale:
            _lost_leases(outcome.stale, "failed attempts were not recorded")

    def record_snoozes(self, snoozed: list[Snooze]) -> None:
        """Put snoozed messages back to wait, their attempt given back."""

        def write() -> transitions.Outcome:
            return transitions.snooze(
                [s.message for s in snoozed],
                [s.seconds for s in snoozed],
                max_snoozes=[s.max_snoozes for s in snoozed],
                using=self.alias,
            )

        outcome = retrying("recording snoozes", write, alias=self.alias, abort=self.abort)
        done = set(outcome.done)
        for s in snoozed:
            if s.message.id in done:
                logger.info(
                    "Message %s (%s on %s) snoozed for %.1fs; its attempt %s is given back.",
                    s.message.id,
                    printable(s.message.task),
                    s.message.queue,
                    s.seconds,
                    s.message.attempts,
                    extra=message_fields(s.message),
                )
        if done and self.on_retried is not None:
            # A snoozed message waits as a retried one does: the worker plans its wake-up.
            self.on_retried({s.message.queue for s in snoozed if s.message.id in done})
        refused = [
            (self._not_snoozed(s, outcome.not_snoozed[s.message.id]), s.message)
            for s in snoozed
            if s.message.id in outcome.not_snoozed
        ]
        if refused:
            self.record_failures(refused)
        if outcome.stale:
            _lost_leases(outcome.stale, "snoozes were not recorded")

    @staticmethod
    def _not_snoozed(snoozed: Snooze, why: str) -> transitions.FailedAttempt:
        """The failure that buries a message whose snooze was refused."""
        message = snoozed.message
        if why == "cancelled":
            type_name, reason = "Cancelled", DeadReason.CANCELLED
            text = "cancel requested; the handler snoozed, so it is not run again"
        else:
            type_name = f"{SnoozeLimitExceeded.__module__}.{SnoozeLimitExceeded.__qualname__}"
            reason = DeadReason.ERROR
            text = (
                f"the handler snoozed it more than {snoozed.max_snoozes} times "
                "(its max_snoozes, or MAX_SNOOZES)"
            )
        error = transitions.error_entry(
            attempt=message.attempts, worker_id=message.leased_by, type_name=type_name, message=text
        )
        return transitions.FailedAttempt(
            lease=message, error=error, retry_in=None, final_reason=reason
        )

    def _excerpt(self, error: dict[str, Any]) -> str:
        """``": <excerpt>"`` of an error message for a log line, or nothing (type only)."""
        excerpt = log_excerpt(error.get("message"), self.log_error_chars)
        return f": {excerpt}" if excerpt else ""


def _lost_leases(ids: list[int], what: str, how: str = "") -> None:
    """Log ``what`` happened to messages whose lease was lost: left to their new owner."""
    logger.warning(
        "%d %s because their lease was lost%s: %s",
        len(ids),
        what,
        how,
        ids[:20],
        extra=batch_fields(ids),
    )
