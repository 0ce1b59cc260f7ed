"""Where a claimer's plain claim starts its walk of the claim index.

Every message processed leaves dead claim-index entries at the head of its queue's index
order. Vacuum removes them, unless a long transaction holds the xmin horizon back: then a
claim that walks from the head visits the heap for every message processed since that
transaction began. A claimer that remembers a lower bound on ``available_at`` under which it
found nothing left to claim walks from that bound instead (``sql.CANDIDATES_FROM``): the
entries below it are passed over on the index alone.

The bound is used only while walks from the head are slow (over :data:`SLOW_HEAD_WALK`):
without a long transaction, a walk from the head marks the dead entries it passes as dead in
the index, so the head stays clean and that walk stays cheap, whereas a walk from a bound
passes over the entries below it without marking them and they pile up until vacuum.

What the bound may miss: a message that becomes claimable with an ``available_at`` below it
(enqueued in a transaction that committed late, or with a ``run_at`` in the past; a lease
released or reset in a transaction older than the bound). The claimer still walks from the
head at least every :data:`HEAD_WALK_EVERY` seconds (longer only when that walk itself is
slow), so such a message waits for that walk, never longer.
"""

from __future__ import annotations

import threading
import time

#: Seconds between the walks from the index head, at least.
HEAD_WALK_EVERY = 1.0
#: The share of the claimer's time the walks from the head may take at most: when one takes
#: longer than this share of HEAD_WALK_EVERY, the next waits in proportion.
HEAD_WALK_SHARE = 0.05
#: A walk from the head that takes longer than this (seconds) makes the next claims walk from
#: the bound, until a walk from the head is this fast again.
SLOW_HEAD_WALK = 0.02
#: Seconds the bound stays behind the database time of the claim that set it: an enqueue
#: whose transaction began that much before the claim and committed after it is still found.
SLACK = 0.5


class ClaimBounds:
    """One claimer's bounds, by queue: pass it to ``Message.objects.lease(bounds=...)``.

    ``slow_head_walk``: seconds over which a walk from the head counts as slow, so that the
    next claims walk from the bound (:data:`SLOW_HEAD_WALK`). Thread-safe: a worker's
    claimers (main loop and listener) share one.
    """

    def __init__(self, *, slow_head_walk: float = SLOW_HEAD_WALK) -> None:
        self._lock = threading.Lock()
        self._slow_head_walk = slow_head_walk
        # Queues whose last walk from the head was slow.
        self._slow: set[str] = set()
        # Seconds since the epoch, database time: no due message of the queue was left
        # unclaimed below this when it was set.
        self._bound: dict[str, float] = {}
        # Monotonic time at which the next claim of the queue walks from the head.
        self._head_due: dict[str, float] = {}

    def start(self, queue: str) -> float | None:
        """The bound the next claim of ``queue`` walks from, or None: from the head."""
        with self._lock:
            bound = self._bound.get(queue)
            if bound is None or queue not in self._slow:
                return None
            if time.monotonic() >= self._head_due.get(queue, 0.0):
                return None
            return bound

    def walked_from_head(self, queue: str, seconds: float) -> None:
        """A walk from the head took ``seconds``: when the next one is due."""
        wait = max(HEAD_WALK_EVERY, seconds / HEAD_WALK_SHARE)
        with self._lock:
            self._head_due[queue] = time.monotonic() + wait
            if seconds > self._slow_head_walk:
                self._slow.add(queue)
            else:
                self._slow.discard(queue)

    def drained(self, queue: str, claim_time: float) -> None:
        """A claim whose transaction began at ``claim_time`` (database time, seconds since
        the epoch) took every due message it found: none is left below it, but for the
        slack."""
        with self._lock:
            bound = claim_time - SLACK
            if bound > self._bound.get(queue, float("-inf")):
                self._bound[queue] = bound
