"""``Message.objects``: the claim order as a queryset, and ``lease()``, the claim (``_claim.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.db import models
from django.db.models import Exists, F
from django.db.models.functions import Now

from . import _claim

if TYPE_CHECKING:
    from ..models import Message


class MessageManager(models.Manager["Message"]):
    def claimable(self, queue: str) -> models.QuerySet[Message]:
        """Messages of ``queue`` a worker may take now, in claim order (served by an index)."""
        # Looked up through the app registry: the models module imports this one.
        queue_state = self.model._meta.apps.get_model("django_pgqueue", "QueueState")
        paused = queue_state.objects.filter(name=queue, paused=True)
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

        ``hold=False`` (default): each queue's claim is one short transaction of its own,
        committed before this returns; calling it inside ``atomic()`` raises
        :class:`LeaseError`, since the lease would otherwise stay uncommitted and invisible to
        other workers' fencing.

        ``hold=True`` (hold-the-lock): runs inside the caller's transaction, which must be
        open; the rows stay locked until it ends and a rollback returns the whole batch
        untouched (attempts included).
        """
        return _claim.lease(
            queues,
            worker_id=worker_id,
            batch_size=batch_size,
            visibility_timeout=visibility_timeout,
            hold=hold,
            using=using,
        )
