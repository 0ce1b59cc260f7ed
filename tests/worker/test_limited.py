"""When a worker claims again from a queue whose claim a limit cut short (``limited.py``)."""

from __future__ import annotations

from django_pgqueue.worker.limited import LimitedQueues


def test_a_claim_cut_short_is_retried_after_the_first_delay() -> None:
    waiting = LimitedQueues(ceiling=5.0, first=0.05)
    waiting.cut_short("q", got=3, now=100.0)
    assert waiting and waiting.next_at() == 100.05
    assert waiting.due(100.04) == []
    assert waiting.due(100.05) == ["q"]
    assert not waiting and waiting.next_at() is None


def test_empty_claims_double_the_delay_up_to_the_ceiling() -> None:
    waiting = LimitedQueues(ceiling=0.3, first=0.05)
    delays = []
    now = 0.0
    for _ in range(5):
        waiting.cut_short("q", got=0, now=now)
        at = waiting.next_at()
        assert at is not None
        delays.append(round(at - now, 3))
        now = at
        assert waiting.due(now) == ["q"]
    assert delays == [0.05, 0.1, 0.2, 0.3, 0.3]
    # A claim that got something (room came back) starts over; so does a full one.
    waiting.cut_short("q", got=2, now=now)
    assert waiting.next_at() == now + 0.05
    waiting.served("q")
    assert not waiting
    waiting.cut_short("q", got=0, now=now)
    assert waiting.next_at() == now + 0.05


def test_written_outcomes_free_room_for_the_queues_waiting_only() -> None:
    waiting = LimitedQueues(ceiling=5.0)
    assert waiting.room_freed({"q"}) == []  # nothing waits: nothing to do
    waiting.cut_short("q", got=0, now=0.0)
    waiting.cut_short("r", got=0, now=0.0)
    assert waiting.room_freed({"q", "plain"}) == ["q"]
    assert waiting.due(10.0) == ["r"]


def test_the_first_delay_is_never_longer_than_the_poll_interval() -> None:
    waiting = LimitedQueues(ceiling=0.01, first=0.05)
    waiting.cut_short("q", got=0, now=0.0)
    assert waiting.next_at() == 0.01
