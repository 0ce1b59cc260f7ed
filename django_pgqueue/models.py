"""The tables: live messages, their archive, the dead letters, queue state and worker heartbeats.

A message id is at every instant in exactly one of :class:`Message`,
:class:`ArchivedMessage` (``message_id``) or :class:`DeadMessage` (``message_id``): every
move between them is one SQL statement (see ``core/_sql.py`` and ``core/_claim_sql.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now

from .core._manager import MessageManager
from .core._validation import (
    DEDUP_KEY_MAX_LENGTH,
    MAX_PRIORITY,
    MIN_PRIORITY,
    QUEUE_NAME_CHECK,
    QUEUE_NAME_MAX_LENGTH,
    TASK_NAME_MAX_LENGTH,
    TENANT_MAX_LENGTH,
)

if TYPE_CHECKING:
    import uuid

MESSAGE_TABLE = "pgqueue_message"
ARCHIVE_TABLE = "pgqueue_archive"
DEAD_TABLE = "pgqueue_dead"
QUEUE_TABLE = "pgqueue_queue"
WORKER_TABLE = "pgqueue_worker"


class MessageFields(models.Model):
    """What a message carries, whichever table it is in."""

    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    task = models.CharField(max_length=TASK_NAME_MAX_LENGTH)
    payload = models.JSONField(null=True, blank=True)
    priority = models.SmallIntegerField(default=0, db_default=0)
    tenant = models.CharField(
        max_length=TENANT_MAX_LENGTH,
        null=True,
        blank=True,
        help_text="Tenant / ordering key for fairness and per-key concurrency limits.",
    )
    dedup_key = models.CharField(max_length=DEDUP_KEY_MAX_LENGTH, null=True, blank=True)
    enqueued_at = models.DateTimeField(db_default=Now())
    attempts = models.IntegerField(default=0, db_default=0)
    max_attempts = models.IntegerField(default=3, db_default=3)
    composed = models.BooleanField(
        default=False,
        db_default=False,
        help_text=(
            "Part of a composition: a batch member, a dependency of a waiting message, or a "
            "message that waited. Only such rows make the archive's and the dead table's "
            "triggers look for what follows from them (core/_composition_sql.py)."
        ),
    )
    errors = models.JSONField(
        default=list,
        db_default=models.Value([], output_field=models.JSONField()),
        blank=True,
        help_text="One entry per failed attempt: attempt, at, worker, type, message, traceback.",
    )
    headers = models.JSONField(
        null=True,
        blank=True,
        help_text="String headers given at enqueue (trace context among them); NULL: none.",
    )

    class Meta:
        abstract = True

    def __str__(self) -> str:
        # The message id, which a message keeps from enqueue to its archive or dead row.
        return f"{self.task} #{getattr(self, 'message_id', self.pk)} on {self.queue}"


def _message_constraints(prefix: str) -> list[models.BaseConstraint]:
    return [
        models.CheckConstraint(
            condition=Q(priority__gte=MIN_PRIORITY) & Q(priority__lte=MAX_PRIORITY),
            name=f"{prefix}_priority_range",
        ),
        models.CheckConstraint(condition=Q(attempts__gte=0), name=f"{prefix}_attempts_gte_0"),
        models.CheckConstraint(
            condition=Q(max_attempts__gte=1), name=f"{prefix}_max_attempts_gte_1"
        ),
    ]


def _queue_name_is_valid(field: str = "queue") -> Q:
    """``_validation.QUEUE_NAME_PATTERN`` as a CHECK (``QUEUE_NAME_CHECK``). It runs on every
    write of a row, each row a claim updates included, and is prepared again for each
    statement: one regular expression is the cheapest spelling of the rule there."""
    return Q(**{f"{field}__regex": QUEUE_NAME_CHECK})


class Message(MessageFields):
    """A live message: ready, scheduled, backing off or leased by a worker.

    ``available_at`` is both the schedule and the visibility time: a claim moves it to
    ``now() + visibility timeout``, so a crashed worker's message becomes claimable again by
    itself once that time passes.
    """

    id = models.BigAutoField(primary_key=True)
    available_at = models.DateTimeField(db_default=Now())
    lease_token = models.UUIDField(null=True, blank=True)
    leased_by = models.CharField(max_length=255, null=True, blank=True)
    leased_at = models.DateTimeField(null=True, blank=True)
    last_error = models.JSONField(null=True, blank=True)
    refund_on_expiry = models.BooleanField(
        default=False,
        db_default=False,
        help_text=(
            "Whether the current lease gives its attempt back if it expires: set when a "
            "worker leases the message (a worker runs a message whose lease expired alone, "
            "and records that start first); cleared by that start. See "
            "docs/explanation/guarantees.md, 'Attempts and failures'."
        ),
    )
    fair_order = models.FloatField(
        null=True,
        blank=True,
        help_text=(
            "Fair queues only: the message's place in its queue's fair order (virtual time, "
            "set at enqueue); -1 while it is outside that order (scheduled, leased, backing "
            "off). NULL in queues without fairness."
        ),
    )
    cancel_requested_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text=(
            "When cancel() flagged this message while a worker held it; its handler sees "
            "context.cancel_requested after the worker's next lease extension."
        ),
    )

    debounce_key = models.CharField(
        max_length=DEDUP_KEY_MAX_LENGTH,
        null=True,
        blank=True,
        help_text=(
            "Debounced messages only (enqueue(..., dedup_key=..., debounce=...)): the key a "
            "later debounced enqueue finds this message by while it has not started."
        ),
    )
    snoozes = models.IntegerField(
        default=0,
        db_default=0,
        help_text="How many times its handler snoozed it (raise Snooze); bounded by MAX_SNOOZES.",
    )

    objects = MessageManager()

    # Set on instances returned by ``lease()``: the previous lease had expired.
    redelivered: bool = False

    class Meta:
        db_table = MESSAGE_TABLE
        verbose_name = "live message"
        constraints = [
            *_message_constraints("pgq_message"),
            # Enforced where a message enters: the archive and the dead table receive rows
            # only from this table, each move one statement (see core/_sql.py).
            models.CheckConstraint(condition=_queue_name_is_valid(), name="pgq_message_queue_name"),
            models.UniqueConstraint(
                fields=["queue", "dedup_key"],
                condition=Q(dedup_key__isnull=False),
                name="pgq_message_dedup_key",
            ),
        ]
        indexes = [
            # Serves the claim: one queue, highest priority first, then oldest available.
            models.Index(
                F("queue"),
                F("priority").desc(),
                F("available_at"),
                F("id"),
                name="pgq_message_claim",
                condition=Q(attempts__lt=F("max_attempts")),
            ),
            # Fair queues (core/_flow_control.py): the fair order itself, which a claim reads
            # from its head; each tenant's newest place in it, where its next message goes;
            # and the messages outside it that are due again, to be given a place. Rows of
            # queues without fairness (fair_order NULL) are in none of the three.
            models.Index(
                F("queue"),
                F("priority").desc(),
                F("fair_order"),
                F("id"),
                name="pgq_message_fair",
                condition=Q(fair_order__gte=0),
            ),
            models.Index(
                fields=["queue", "tenant", "priority", "fair_order"],
                name="pgq_message_fair_tenant",
                condition=Q(fair_order__gte=0),
            ),
            # Not leased: a leased message, due again when its lease expires, is found in
            # pgq_message_leased (one index entry less per claimed message). By time alone,
            # so that a scan for what is due stops at the first message still waiting.
            models.Index(
                fields=["queue", "available_at", "id"],
                name="pgq_message_fair_due",
                condition=Q(fair_order__lt=0)
                & Q(lease_token__isnull=True)
                & Q(attempts__lt=F("max_attempts")),
            ),
            # Flow-controlled queues' leases (a flow claim marks them fair_order -1): what a
            # claim with limits counts as in flight, those with an unexpired lease; those
            # expired are due again.
            models.Index(
                fields=["queue", "available_at"],
                name="pgq_message_leased",
                condition=Q(lease_token__isnull=False) & Q(fair_order__lt=0),
            ),
            # Serves the reaper: leases that ran out on their last attempt.
            models.Index(
                fields=["queue", "available_at"],
                name="pgq_message_exhausted",
                condition=Q(attempts__gte=F("max_attempts")),
            ),
            # The admin dashboard's failed attempts: the few live rows that have failed before.
            models.Index(fields=["queue"], name="pgq_message_failed", condition=~Q(errors=[])),
            # Debounce (core/_enqueue_control.py): a key's waiting message. Other rows are not
            # in it. Not unique: a started message keeps its key beside its successor's.
            models.Index(
                fields=["queue", "debounce_key"],
                name="pgq_message_debounce",
                condition=Q(debounce_key__isnull=False),
            ),
        ]
        permissions = [
            ("retry_now_message", "Can make a waiting live message available now"),
            ("release_message", "Can release a live message's lease"),
            ("discard_message", "Can discard a live message to the dead table"),
            ("purge_queue", "Can purge all live messages of a queue"),
            ("cancel_message", "Can cancel a live message"),
        ]

    @property
    def lease(self) -> tuple[int, uuid.UUID | None]:
        """The ``(id, lease_token)`` pair that fences completions."""
        return (self.id, self.lease_token)


class ArchivedMessage(MessageFields):
    """A message that finished successfully, with its result.

    The table is partitioned by day of ``finished_at`` (``core/_partitions.py``), so that
    retention drops a whole day at once. Its primary key is ``(id, finished_at)`` in the
    database, ``id`` for Django: ids come from one sequence, so ``id`` alone names one row,
    and ``message_id`` is unique because a message enters the archive once (one statement
    moves it out of the live table).
    """

    id = models.BigAutoField(primary_key=True)
    message_id = models.BigIntegerField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(db_default=Now())
    worker_id = models.CharField(max_length=255, null=True, blank=True)
    result = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = ARCHIVE_TABLE
        verbose_name = "archived message"
        constraints = _message_constraints("pgq_archive")
        indexes = [
            models.Index(fields=["queue", "finished_at"], name="pgq_archive_finished"),
            # Result lookups by message id (the Tasks backend): one probe per partition.
            models.Index(fields=["message_id"], name="pgq_archive_message_id"),
            # The admin dashboard's failed attempts: archived rows that failed before.
            models.Index(
                fields=["queue", "finished_at"],
                name="pgq_archive_failed",
                condition=~Q(errors=[]),
            ),
        ]
        permissions = [("requeue_archivedmessage", "Can requeue an archived message")]


class DeadReason(models.TextChoices):
    REJECTED = "rejected", "rejected (unknown task or undecodable payload)"
    ERROR = "error", "error (handler raised on its last attempt)"
    TIMEOUT = "timeout", "timeout"
    LEASE_EXPIRED = "lease_expired", "lease expired on its last attempt"
    DISCARDED = "discarded", "discarded by an operator"
    CANCELLED = "cancelled", "cancelled (django_pgqueue.cancel)"
    DEPENDENCY_FAILED = "dependency_failed", "a message it depends on failed"


class DeadMessage(MessageFields):
    """A message that failed for good, with the reason and what happened on each attempt."""

    id = models.BigAutoField(primary_key=True)
    message_id = models.BigIntegerField(unique=True)
    reason = models.CharField(max_length=32, choices=DeadReason.choices)
    details = models.JSONField(
        default=dict,
        blank=True,
        help_text="type, message and traceback of the final failure.",
    )
    worker_id = models.CharField(max_length=255, null=True, blank=True)
    died_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = DEAD_TABLE
        verbose_name = "dead message"
        constraints = [
            *_message_constraints("pgq_dead"),
            models.CheckConstraint(
                condition=Q(reason__in=DeadReason.values), name="pgq_dead_reason_valid"
            ),
        ]
        indexes = [models.Index(fields=["queue", "died_at"], name="pgq_dead_died")]
        permissions = [("retry_deadmessage", "Can retry a dead message")]


class QueueState(models.Model):
    """Per-queue switches operators flip at run time (pause) and their limits."""

    name = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, primary_key=True)
    paused = models.BooleanField(default=False, db_default=False)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = QUEUE_TABLE
        verbose_name = "queue"
        constraints = [
            models.CheckConstraint(
                condition=_queue_name_is_valid("name"), name="pgq_queue_name_valid"
            )
        ]
        permissions = [("pause_queue", "Can pause and resume a queue")]

    def __str__(self) -> str:
        return f"{self.name}{' (paused)' if self.paused else ''}"


class WorkerHeartbeat(models.Model):
    """One row per running worker, refreshed every heartbeat; stale rows mean dead workers."""

    worker_id = models.CharField(max_length=255, primary_key=True)
    hostname = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    queues = models.JSONField(default=list, blank=True)
    concurrency = models.IntegerField(default=1)
    started_at = models.DateTimeField(db_default=Now())
    last_seen_at = models.DateTimeField(db_default=Now())
    stats: models.JSONField[Any] = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = WORKER_TABLE
        verbose_name = "worker"

    def __str__(self) -> str:
        return self.worker_id


# Composition's tables (waiting messages, dependencies, batches), flow control's state (the
# sessions' allowances, the rates), the maintenance runs and the periodic schedules belong to
# this app too. The pipeline's tables belong to django_pgqueue.pipeline.
from .core._composition_models import (  # noqa: E402, F401
    Batch,
    BatchMember,
    Dependency,
    WaitingMessage,
)
from .core._flow_models import FlowAllowance, FlowRate  # noqa: E402, F401
from .core._job_control_models import MessageProgress, UniqueWindow  # noqa: E402, F401
from .core._maintenance_models import MaintenanceState  # noqa: E402, F401
from .core._periodic_models import PeriodicSchedule  # noqa: E402, F401
