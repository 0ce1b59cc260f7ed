"""The worker's head watcher: while its claims walk from their bounds, it looks at the head of
each such queue's claim index (of a fair queue: of its fair order), in its own thread and on
its own connection.

A claim that walks from its bounds (``core/_claim_bound.py``) cannot see a message that fell
due below them: one enqueued in a transaction that committed late, with a ``run_after`` in
the past, at a priority the worker has not taken yet, or in a fair queue one whose claim
rolled back. A look from the head finds those, but
while a long transaction keeps dead entries there, that look is slow, and a claim that made
it would hold up every claim of the worker (they take turns) for as long. So the watcher
makes it beside the claims and lowers the bounds to what it found: the next claim takes it.
It looks as often as a claim would have walked from the head (every ``HEAD_WALK_EVERY``
seconds, less often while the look is slow) and only at the queues whose claims walk from
bounds; it holds no connection while there are none.
"""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError, connections

from ..core._claim import look_from_head
from ..core._claim_bound import HEAD_WALK_EVERY, ClaimBounds, head_walk_pause
from .db import is_connection_error
from .service import Service

logger = logging.getLogger("django_pgqueue.worker")


class HeadWatcher(Service):
    """Looks at the heads of the bounded queues; its timer is the pause between looks."""

    name = "head watcher"

    def __init__(self, *, alias: str, bounds: ClaimBounds, stop: threading.Event) -> None:
        super().__init__(stop=stop)
        self.alias = alias
        self.bounds = bounds
        #: Looks made (test seam).
        self.looks = 0

    def run(self) -> None:
        pause = HEAD_WALK_EVERY
        while not self.halt.wait(pause):
            queues = self.bounds.bounded_queues()
            if not queues:
                connections.close_all()  # this thread's own
                pause = HEAD_WALK_EVERY
                continue
            pause = max(head_walk_pause(self._look(queue)) for queue in queues)

    def _look(self, queue: str) -> float:
        """Look at the head of ``queue``: the seconds it took (0 when it failed)."""
        try:
            seconds = look_from_head(queue, self.bounds, alias=self.alias)
        except DatabaseError as exc:
            if is_connection_error(exc):
                logger.warning("Head watcher: the database is unreachable (%s).", exc)
                connections[self.alias].close()
            else:
                logger.exception("Head watcher: the look at %r failed.", queue)
            return 0.0
        except Exception:
            # A bug here must not cost the worker its watcher: the next look tries again.
            logger.exception("Head watcher: the look at %r failed.", queue)
            return 0.0
        self.looks += 1
        return seconds
