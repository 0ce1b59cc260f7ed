"""``Message.objects``: leasing with ``select_for_update(skip_locked=True)`` under a visibility timeout."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections, models, transaction
from django.db.models import Exists, F
from django.db.models.functions import Now

from ..conf import get_settings
from ..exceptions import LeaseError
from . import sql
from .validation import validate_queue_name

if TYPE_CHECKING:
    from ..models import Message

logger = logging.getLogger("django_pgqueue")

# How many exhausted leases one claim buries at most (keeps the claim statement short).
REAP_LIMIT = 100


class MessageManager(models.Manager["Message"]):
    def claimable(self, queue: str) -> models.QuerySet[Message]:
        """Messages of ``queue`` a worker may take now, in claim order (served by an index)."""
        from ..models import QueueState

        paused = QueueState.objects.filter(name=queue, paused=True)
        return (
            self.filter(queue=queue, available_at__lte=Now(), attempts__lt=F("max_attempts"))
            .exclude(Exists(paused))
            .order_by("-priority", "available_at", "id")
        )

    def lease(
        self,
        queues: str | Sequence[str],
        *,
        worker_id: str,
        batch_size: int = 1,
        visibility_timeout: float | None = None,
        hold: bool = False,
        using: str | None = None,
    ) -> list[Message]:
        """Lease up to ``batch_size`` ready messages for ``worker_id``.

        Each message comes back with ``attempts`` already counted, a fresh ``lease_token`` and
        ``available_at`` pushed to database ``now()`` + ``visibility_timeout`` seconds: if the
        worker dies, the message becomes claimable again by itself. Queues are tried in the
        given order until the batch is full; within a queue, higher priority first, then the
        oldest available, then the lowest id.

        ``hold=False`` (default): one short transaction of its own, committed before this
        returns; calling it inside ``atomic()`` raises :class:`LeaseError`, since the lease
        would otherwise stay uncommitted and invisible to other workers' fencing.

        ``hold=True`` (hold-the-lock): runs inside the caller's transaction, which must be
        open; the rows stay locked until it ends and a rollback returns the whole batch
        untouched (attempts included).
        """
        queue_list = [queues] if isinstance(queues, str) else list(queues)
        for queue in queue_list:
            validate_queue_name(queue)
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        alias = using or get_settings().DATABASE_ALIAS
        vt = self._visibility_timeout(queue_list, visibility_timeout)
        connection = connections[alias]
        if hold:
            if not connection.in_atomic_block:
                raise LeaseError("lease(hold=True) must run inside transaction.atomic().")
            return self._lease_queues(queue_list, worker_id, batch_size, vt, alias)
        if connection.in_atomic_block:
            raise LeaseError(
                "lease() commits its own short transaction; inside transaction.atomic() use "
                "lease(hold=True) so the caller's transaction owns the lease."
            )
        with transaction.atomic(using=alias):
            return self._lease_queues(queue_list, worker_id, batch_size, vt, alias)

    @staticmethod
    def _visibility_timeout(queues: list[str], requested: float | None) -> float:
        if requested is not None:
            if requested <= 0:
                raise ValueError("visibility_timeout must be > 0 seconds")
            return float(requested)
        conf = get_settings()
        return float(max(conf.for_queue(q, "VISIBILITY_TIMEOUT") for q in queues))

    def _lease_queues(
        self, queues: list[str], worker_id: str, batch_size: int, vt: float, alias: str
    ) -> list[Message]:
        leased: list[Message] = []
        for queue in queues:
            wanted = batch_size - len(leased)
            if wanted <= 0:
                break
            leased.extend(self._lease_one_queue(queue, worker_id, wanted, vt, alias))
        return leased

    def _lease_one_queue(
        self, queue: str, worker_id: str, limit: int, vt: float, alias: str
    ) -> list[Message]:
        candidates = (
            self.claimable(queue)
            .using(alias)
            .select_for_update(skip_locked=True)
            .values("id", "lease_token")[:limit]
        )
        candidates_sql, candidates_params = candidates.query.sql_with_params()
        statement = sql.LEASE.format(
            candidates=candidates_sql,
            reap_limit=REAP_LIMIT,
            shared=sql.SHARED_COLUMNS,
            leased_columns=", ".join(f"m.{c}" for c in sql.LEASED_COLUMNS),
        )
        params = [queue, *candidates_params, worker_id, vt]
        with connections[alias].cursor() as cursor:
            cursor.execute(statement, params)
            rows = cursor.fetchall()
        leased: list[Message] = []
        for outcome, *values in rows:
            if outcome == "buried":
                logger.warning(
                    "Message %s (%s on %s) dead-lettered: lease_expired after %s attempts "
                    "(last worker %s).",
                    values[0],
                    values[2],
                    values[1],
                    values[9],
                    values[13],
                )
                continue
            *columns, redelivered = values
            message = self._from_row(columns, alias)
            message.redelivered = redelivered
            if redelivered:
                logger.warning(
                    "Message %s (%s on %s) redelivered: its previous lease expired "
                    "(attempt %s of %s).",
                    message.id,
                    message.task,
                    message.queue,
                    message.attempts,
                    message.max_attempts,
                )
            leased.append(message)
        return leased

    def _from_row(self, values: Sequence[Any], alias: str) -> Message:
        fields = dict(zip(sql.LEASED_COLUMNS, values, strict=True))
        for name in ("payload", "errors", "last_error"):
            if isinstance(fields[name], str):
                fields[name] = json.loads(fields[name])
        message = self.model(**fields)
        message._state.adding = False
        message._state.db = alias
        return message
