"""The attempt rule (core/_sql.py): a worker's lease that expires gives its attempt back
unless its handler had started alone; other claims count every attempt."""

import pytest
from django.db import connection

import django_pgqueue
from django_pgqueue.core import _execution, transitions
from django_pgqueue.models import DeadMessage, Message

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker_session():
    """This thread's connection as a worker's claim session (its leases refund on expiry)."""
    connection.close()
    _execution.dedicate_to_claims(connection, refund_on_expiry=True)
    yield
    connection.close()


def lease(batch_size=10):
    return Message.objects.lease("default", worker_id="w1", batch_size=batch_size)


def _expire(*ids):
    """The leases run out now, as when their worker died (database time)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_message SET available_at = now() - interval '1 second' "
            "WHERE id = ANY(%s)",
            [list(ids)],
        )


def row(message_id):
    return Message.objects.get(id=message_id)


def test_an_expired_worker_lease_that_never_started_alone_gives_its_attempt_back(
    worker_session,
):
    msg = django_pgqueue.enqueue("t", {}, max_attempts=3)
    first = lease()[0]
    assert first.attempts == 1 and not first.redelivered
    assert row(msg.id).refund_on_expiry
    for _ in range(5):  # the worker dies again and again while the message waits its turn
        _expire(msg.id)
        again = lease()[0]
        assert again.redelivered and again.attempts == 1
    assert not DeadMessage.objects.exists()


def test_an_expired_lease_that_started_alone_spends_its_attempt_then_is_buried(worker_session):
    msg = django_pgqueue.enqueue("t", {}, max_attempts=2)
    lease()
    _expire(msg.id)  # crash beside others: given back
    for attempt in (1, 2):
        leased = lease()[0]
        assert leased.redelivered and leased.attempts == attempt
        assert transitions.start_alone(leased)
        assert not row(msg.id).refund_on_expiry
        _expire(msg.id)  # crash while running alone: spent
    assert lease() == []
    dead = DeadMessage.objects.get(message_id=msg.id)
    assert dead.reason == "lease_expired" and dead.attempts == 2


def test_a_last_attempt_that_expires_before_starting_alone_is_given_back_not_buried(
    worker_session,
):
    msg = django_pgqueue.enqueue("t", {}, max_attempts=1)
    assert lease()[0].attempts == 1  # the last attempt, leased beside others
    _expire(msg.id)
    assert lease() == []  # the reaper gives it back (it is claimable from the next claim)
    assert not DeadMessage.objects.exists()
    again = lease()[0]
    assert again.redelivered and again.attempts == 1
    assert transitions.start_alone(again)
    _expire(msg.id)
    assert lease() == []
    assert DeadMessage.objects.get(message_id=msg.id).reason == "lease_expired"


def test_start_alone_is_fenced_by_the_lease_token(worker_session):
    msg = django_pgqueue.enqueue("t", {})
    old = lease()[0]
    _expire(msg.id)
    lease()
    assert not transitions.start_alone(old)
    assert row(msg.id).refund_on_expiry


def test_claims_outside_a_worker_count_every_attempt():
    """``lease()`` called by your own code: no promise to run anything alone, so every
    expired lease spends its attempt (a message that crashes its consumer ends dead)."""
    connection.close()
    msg = django_pgqueue.enqueue("t", {}, max_attempts=2)
    assert lease()[0].attempts == 1
    assert not row(msg.id).refund_on_expiry
    _expire(msg.id)
    assert lease()[0].attempts == 2
    _expire(msg.id)
    assert lease() == []
    assert DeadMessage.objects.get(message_id=msg.id).attempts == 2
