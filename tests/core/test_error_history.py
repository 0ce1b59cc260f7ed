"""Bounded attempts and a bounded error history: a message that fails for ever keeps the
errors of its first and last attempts and a count of the ones between (issue #58)."""

import pytest
from django.db import connection
from django.test import override_settings

import django_pgqueue
from django_pgqueue import InvalidMessage
from django_pgqueue.conf import SettingsError, get_settings
from django_pgqueue.core import transitions
from django_pgqueue.core._sql import ERROR_HISTORY_ENDS
from django_pgqueue.core._validation import MAX_ATTEMPTS_LIMIT
from django_pgqueue.core.transitions import FailedAttempt, error_entry
from django_pgqueue.models import DeadMessage, Message

pytestmark = pytest.mark.django_db(transaction=True)

ENDS = ERROR_HISTORY_ENDS


def fail_times(message_id: int, times: int, *, first: int = 1) -> list[int]:
    """Lease and fail the message ``times`` times; the buried ids of the last round."""
    buried: list[int] = []
    for attempt in range(first, first + times):
        Message.objects.filter(pk=message_id).update(available_at=django_now())
        [leased] = Message.objects.lease("default", worker_id="w1")
        error = error_entry(ValueError(f"failure {attempt}"), attempt=attempt, worker_id="w1")
        buried = transitions.fail([FailedAttempt(leased, error, retry_in=0)]).buried
    return buried


def django_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def assert_bounded(errors: list, failures: int) -> None:
    assert len(errors) == 2 * ENDS + 1
    assert [e["attempt"] for e in errors[:ENDS]] == list(range(1, ENDS + 1))
    assert errors[ENDS] == {"omitted": failures - 2 * ENDS}
    assert [e["attempt"] for e in errors[ENDS + 1 :]] == list(
        range(failures - ENDS + 1, failures + 1)
    )
    assert errors[-1]["message"] == f"failure {failures}"


def test_a_history_up_to_both_ends_is_kept_whole() -> None:
    sent = django_pgqueue.enqueue("t", {}, max_attempts=100)
    fail_times(sent.id, 2 * ENDS)
    errors = Message.objects.get(pk=sent.id).errors
    assert [e["attempt"] for e in errors] == list(range(1, 2 * ENDS + 1))


def test_a_message_failing_far_more_often_keeps_its_first_and_last_errors_and_a_count() -> None:
    failures = 6 * ENDS + 3
    sent = django_pgqueue.enqueue("t", {}, max_attempts=failures + 1)

    fail_times(sent.id, failures)

    row = Message.objects.get(pk=sent.id)
    assert row.attempts == failures
    assert_bounded(row.errors, failures)
    assert row.last_error["message"] == f"failure {failures}"


def test_the_dead_message_of_a_long_history_is_bounded_with_the_right_count() -> None:
    failures = 4 * ENDS
    sent = django_pgqueue.enqueue("t", {}, max_attempts=failures)

    assert fail_times(sent.id, failures) == [sent.id]

    dead = DeadMessage.objects.get(message_id=sent.id)
    assert dead.attempts == failures
    assert_bounded(dead.errors, failures)


def test_a_long_history_stored_before_the_bound_is_cut_at_the_next_failure() -> None:
    sent = django_pgqueue.enqueue("t", {}, max_attempts=MAX_ATTEMPTS_LIMIT)
    old = [{"attempt": n, "message": f"failure {n}"} for n in range(1, 501)]
    Message.objects.filter(pk=sent.id).update(errors=old, attempts=500)

    fail_times(sent.id, 1, first=501)

    assert_bounded(Message.objects.get(pk=sent.id).errors, 501)


@pytest.mark.parametrize("bad", [MAX_ATTEMPTS_LIMIT + 1, 10**9])
def test_max_attempts_above_the_limit_is_refused_at_enqueue(bad: int) -> None:
    with pytest.raises(InvalidMessage, match=f"between 1 and {MAX_ATTEMPTS_LIMIT}"):
        django_pgqueue.enqueue("t", {}, max_attempts=bad)
    with pytest.raises(InvalidMessage, match=f"between 1 and {MAX_ATTEMPTS_LIMIT}"):
        django_pgqueue.enqueue_many("t", [{}], max_attempts=bad)
    assert not Message.objects.exists()


def test_max_attempts_at_the_limit_is_accepted() -> None:
    sent = django_pgqueue.enqueue("t", {}, max_attempts=MAX_ATTEMPTS_LIMIT)
    assert Message.objects.get(pk=sent.id).max_attempts == MAX_ATTEMPTS_LIMIT


def test_max_attempts_above_the_limit_is_refused_at_handler_registration() -> None:
    with pytest.raises(InvalidMessage, match=f"between 1 and {MAX_ATTEMPTS_LIMIT}"):
        django_pgqueue.handler("too.many", max_attempts=MAX_ATTEMPTS_LIMIT + 1)


@pytest.mark.parametrize(
    "pgqueue",
    [
        {"MAX_ATTEMPTS": MAX_ATTEMPTS_LIMIT + 1},
        {"QUEUES": {"emails": {"MAX_ATTEMPTS": MAX_ATTEMPTS_LIMIT + 1}}},
    ],
)
def test_max_attempts_above_the_limit_is_refused_in_settings(pgqueue: dict) -> None:
    with override_settings(PGQUEUE=pgqueue), pytest.raises(SettingsError) as info:
        get_settings()
    assert f"[1, {MAX_ATTEMPTS_LIMIT}]" in str(info.value)
