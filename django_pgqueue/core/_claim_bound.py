"""Where a claimer's plain claim starts its walks of the claim index.

Every message processed leaves dead claim-index entries at the head of its queue's index
order. Vacuum removes them, unless a long transaction holds the xmin horizon back: then a
claim that walks from the head visits the heap for every message processed since that
transaction began. A claimer that remembers, for each priority level of a queue, a lower
bound on ``available_at`` under which it found nothing left to claim walks each level from
its bound instead (``_claim_sql.BOUNDED_CLAIM``): the entries below it are never read.

A level's bound moves up after each claim: to the claim's time for a level the claim walked
to its end (less :data:`SLACK`), to the last message the claim took from it (less the same
slack) when the batch filled up there. So the walks stay short while a backlog is worked
off, not only when the queue is drained.

The bound is used only while walks from the head are slow (over :data:`SLOW_HEAD_WALK`):
without a long transaction, a walk from the head marks the dead entries it passes as dead in
the index, so the head stays clean and that walk stays cheap, whereas a walk from a bound
passes over the entries below it without marking them and they pile up until vacuum.

What the walks from the bounds may miss: a message that becomes claimable with an
``available_at`` below its level's bound (enqueued in a transaction that committed late, or
with a ``run_at`` in the past; a lease released or reset in a transaction older than the
bound), or at a priority level no claim of this claimer has taken a message from yet. The
claimer still walks from the head at least every :data:`HEAD_WALK_EVERY` seconds (longer
only when that walk itself is slow), so such a message waits for that walk, never longer. A
queue with more than :data:`MAX_LEVELS` levels is always walked from the head.

A fair queue's claims (``core/_flow_sql.py``, ``pgq_flow_head``) walk its fair order the
same way, their bounds places in that order rather than times, and always from the bounds
once known: the fair order's index is filled out of order (each tenant's next message goes
between everyone's), so its dead entries spread over three to four times the pages of the
plain claim index's, and a walk from its head reads them all even once they are marked. A
level's bound moves up to the first place the claim took from it when the batch filled up
there (with its id: a place is shared by one message of every tenant in a round): what
others were claiming below it at the time stays within the walk, and so does a new tenant's
message, which enters at the head of the order (a place below that only if it
was enqueued in a transaction that committed late). A level a claim walked to its end goes
back to the head of the level: its next message may enter at place 0. A fair queue whose
claims pass over messages (key limits and key rates) is always walked from the head.
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
#: Priority levels of one queue walked from their bounds at most, one index seek each.
MAX_LEVELS = 16


#: A message's place in a claim order, or a bound on it: its ``available_at`` in seconds since
#: the epoch (database time), or in a fair queue its place in the fair order; then its id,
#: which orders the messages of one place (0 in a plain claim's bounds, which compare the
#: time alone).
Position = tuple[float, int]
#: A priority level and a position in it: (priority, time or place, id).
Level = tuple[int, float, int]

_BOTTOM: Position = (float("-inf"), 0)
_TOP: Position = (float("inf"), 0)


class ClaimBounds:
    """One claimer's bounds, by queue and priority level: pass it to every claim of the
    claimer (``_claim.lease(bounds=...)``).

    ``slow_head_walk``: seconds over which a walk from the head counts as slow, so that the
    next claims walk from the bounds (:data:`SLOW_HEAD_WALK`).

    ``head_walks_in_claims``: while claims walk from the bounds, one of them walks from the
    head every :data:`HEAD_WALK_EVERY` seconds or more (True, the default); or never (False),
    when something else looks at the head in their stead and reports what it saw with
    :meth:`seen_from_head` (``_claim.look_from_head``, the worker's head watcher):
    then no claim waits for a slow walk.

    Thread-safe: a worker's claimers (main loop and listener) share one.
    """

    def __init__(
        self, *, slow_head_walk: float = SLOW_HEAD_WALK, head_walks_in_claims: bool = True
    ) -> None:
        self._lock = threading.Lock()
        self._slow_head_walk = slow_head_walk
        self._head_walks_in_claims = head_walks_in_claims
        # Queues whose last walk from the head was slow.
        self._slow: set[str] = set()
        # Fair queues: walked from their bounds whenever they are known; places as bounds.
        self._fair: set[str] = set()
        # By queue, by priority level: the position under which no due message of that level
        # was left unclaimed (a Position).
        self._bounds: dict[str, dict[int, Position]] = {}
        # By queue, by priority level: monotonic time a look at the head last lowered it.
        self._lowered: dict[str, dict[int, float]] = {}
        # Monotonic time at which the next claim of the queue walks from the head.
        self._head_due: dict[str, float] = {}

    def start(self, queue: str, *, fair: bool = False) -> list[Level] | None:
        """The levels the next claim of ``queue`` walks, highest priority first, each with
        its bound (a :data:`Level`); or None: that claim walks from the head. ``fair``: the
        claim walks the queue's fair order (its bounds are places in it)."""
        with self._lock:
            if fair:
                self._fair.add(queue)
            levels = self._bounds.get(queue)
            if not levels or len(levels) > MAX_LEVELS:
                return None
            if queue not in self._slow and queue not in self._fair:
                return None
            if self._head_walks_in_claims and time.monotonic() >= self._head_due.get(queue, 0):
                return None
            return _levels(levels)

    def known(self, queue: str) -> list[Level]:
        """The levels of ``queue`` and their bounds, highest priority first, whether or not
        the next claim walks from them."""
        with self._lock:
            return _levels(self._bounds.get(queue, {}))

    def bounded_queues(self) -> list[str]:
        """The queues whose claims walk from the bounds: fair queues, and those whose last
        walk from the head was slow."""
        with self._lock:
            return sorted(self._slow | self._fair)

    def walked_from_head(self, queue: str, seconds: float) -> None:
        """A walk from the head took ``seconds``: when the next one is due."""
        with self._lock:
            self._head_due[queue] = time.monotonic() + head_walk_pause(seconds)
            if seconds > self._slow_head_walk:
                self._slow.add(queue)
            else:
                self._slow.discard(queue)

    def seen_from_head(self, queue: str, due: list[Level]) -> None:
        """A look at the head of ``queue``, which claimed nothing, found these messages due
        (each as a :data:`Level`: its priority and position): a level's bound comes down to
        the first of them below it, a level not known yet is added."""
        now = time.monotonic()
        with self._lock:
            levels = self._bounds.setdefault(queue, {})
            lowered = self._lowered.setdefault(queue, {})
            for priority, position, message_id in due:
                if (position, message_id) < levels.get(priority, _TOP):
                    levels[priority] = (position, message_id)
                    lowered[priority] = now

    def claimed(
        self,
        queue: str,
        taken: list[Level],
        claim_time: float,
        *,
        full: bool,
        began: float,
    ) -> None:
        """A claim whose transaction began at ``claim_time`` took ``taken``: each message's
        priority and position when taken (a :data:`Level`), in claim order. ``full``: the
        batch filled up, so the walk stopped in the level of the last message taken.
        ``began``: monotonic time before the claim asked :meth:`start`; a level lowered since
        then stays as it is (the claim may have walked it from the bound before). A claim
        that took nothing walked every level to its end: in a fair queue its levels go back
        to their heads, as their next messages may enter at place 0."""
        with self._lock:
            fair = queue in self._fair
            if not taken and not fair:
                return
            levels = self._bounds.setdefault(queue, {})
            lowered = self._lowered.get(queue, {})
            for priority, _, _ in taken:
                levels.setdefault(priority, _BOTTOM)
            last_level = taken[-1][0] if full else None
            for priority in levels:
                if lowered.get(priority, float("-inf")) >= began:
                    continue
                bound: Position
                if last_level is None or priority > last_level:
                    if fair:
                        # Walked to its end: its next message may enter at place 0.
                        levels[priority] = _BOTTOM
                        continue
                    # Walked to its end: nothing due was left in it, but for the slack.
                    bound = (claim_time - SLACK, 0)
                elif priority == last_level:
                    # Fair: the head of the level when the claim walked it (its first message
                    # taken there). Plain: nothing due was left before the last message taken
                    # from it, but for the slack.
                    positions = [(position, i) for p, position, i in taken if p == priority]
                    bound = min(positions) if fair else (max(positions)[0] - SLACK, 0)
                else:
                    continue
                if bound > levels[priority]:
                    levels[priority] = bound


def _levels(bounds: dict[int, Position]) -> list[Level]:
    return [(priority, *bounds[priority]) for priority in sorted(bounds, reverse=True)]


def head_walk_pause(seconds: float) -> float:
    """Seconds until the next walk from the head, after one that took ``seconds``."""
    return max(HEAD_WALK_EVERY, seconds / HEAD_WALK_SHARE)
