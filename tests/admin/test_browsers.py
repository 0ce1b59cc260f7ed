"""The message browsers: read-only, escaped and truncated JSON, readable tracebacks, cheap
filters and counts that stop at the cap."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_pgqueue.admin.display import DETAIL_LIMIT
from django_pgqueue.core import operations
from django_pgqueue.models import DeadReason
from tests.admin.conftest import StaffClient
from tests.factories import ArchivedMessageFactory, DeadMessageFactory, MessageFactory

pytestmark = pytest.mark.django_db

HOSTILE = "<script>alert('pwned')</script>"
LISTS = ["message", "archivedmessage", "deadmessage"]


@pytest.mark.parametrize("model", LISTS)
def test_browsers_are_read_only(staff_client: StaffClient, model: str) -> None:
    client = staff_client(superuser=True)
    assert client.get(reverse(f"admin:django_pgqueue_{model}_add")).status_code == 403
    page = client.get(reverse(f"admin:django_pgqueue_{model}_changelist"))
    assert page.status_code == 200
    assert 'value="delete_selected"' not in page.text


def test_payloads_are_escaped_pretty_and_truncated(staff_client: StaffClient) -> None:
    message = MessageFactory(payload={"html": HOSTILE, "big": "x" * (DETAIL_LIMIT + 500)})
    MessageFactory(payload={"html": HOSTILE})
    client = staff_client()

    listing = client.get(reverse("admin:django_pgqueue_message_changelist"))
    assert HOSTILE not in listing.text
    assert "&lt;script&gt;" in listing.text

    page = client.get(reverse("admin:django_pgqueue_message_change", args=[message.pk]))
    assert HOSTILE not in page.text
    assert '<pre class="pgq-json">{\n  &quot;big&quot;' in page.text
    assert "more characters)" in page.text


def test_dead_message_page_shows_reason_traceback_and_every_attempt(
    staff_client: StaffClient,
) -> None:
    trace = f'Traceback (most recent call last):\n  File "h.py", line 3\nValueError: {HOSTILE}'
    dead = DeadMessageFactory(
        details={"type": "ValueError", "message": HOSTILE, "traceback": trace},
        errors=[
            {"attempt": 1, "at": "t1", "worker": "w1", "type": "KeyError", "message": "k"},
            {"attempt": 2, "at": "t2", "worker": "w2", "type": "ValueError", "traceback": trace},
        ],
    )

    page = staff_client().get(reverse("admin:django_pgqueue_deadmessage_change", args=[dead.pk]))

    assert HOSTILE not in page.text
    assert '<pre class="pgq-traceback">Traceback (most recent call last):\n' in page.text
    assert "<strong>attempt 1</strong> at t1 on w1: KeyError: k" in page.text
    assert "<strong>attempt 2</strong>" in page.text


def test_dead_filters_and_search(staff_client: StaffClient) -> None:
    timeout = DeadMessageFactory(queue="emails", task="send", reason=DeadReason.TIMEOUT)
    DeadMessageFactory(queue="emails", task="send", reason=DeadReason.ERROR)
    DeadMessageFactory(queue="reports", task="build", reason=DeadReason.TIMEOUT)
    client = staff_client()
    url = reverse("admin:django_pgqueue_deadmessage_changelist")

    def ids(**params: str) -> set[int]:
        response = client.get(url, params)
        assert response.status_code == 200
        return {obj.pk for obj in response.context["cl"].result_list}

    assert ids(queue="emails", reason__exact="timeout") == {timeout.pk}
    assert len(ids(task="send")) == 2
    assert ids(q=str(timeout.message_id)) == {timeout.pk}
    # A task name is found with the task filter; search takes only what an index serves.
    assert ids(q="build") == set()
    assert ids(q="nothing-matches") == set()
    an_hour_ago = (timezone.now() - dt.timedelta(hours=1)).isoformat()
    assert len(ids(died_at__gte=an_hour_ago)) == 3
    # Choices come from the indexes and the reason choices, listed on the page.
    page = client.get(url).text
    assert "?queue=reports" in page
    assert "?reason__exact=lease_expired" in page


def test_live_state_filter_uses_database_time(staff_client: StaffClient) -> None:
    ready = MessageFactory(available_at=timezone.now() - dt.timedelta(minutes=1))
    later = MessageFactory(available_at=timezone.now() + dt.timedelta(hours=1))
    leased = MessageFactory(leased=True)
    client = staff_client()
    url = reverse("admin:django_pgqueue_message_changelist")

    def ids(state: str) -> set[int]:
        return {m.pk for m in client.get(url, {"state": state}).context["cl"].result_list}

    assert ids("ready") == {ready.pk}
    assert ids("scheduled") == {later.pk}
    assert ids("in_flight") == {leased.pk}


@pytest.mark.parametrize("model", LISTS)
def test_change_lists_never_count_the_whole_table(staff_client: StaffClient, model: str) -> None:
    MessageFactory.create_batch(3)
    ArchivedMessageFactory.create_batch(3)
    DeadMessageFactory.create_batch(3)
    client = staff_client()
    with CaptureQueriesContext(connection) as queries:
        assert client.get(reverse(f"admin:django_pgqueue_{model}_changelist")).status_code == 200
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts, "the paginator should still count (capped)"
    assert all("LIMIT" in sql.upper() for sql in counts), counts


def test_list_count_stops_at_the_cap_and_says_so(
    staff_client: StaffClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_pgqueue.admin import actions

    monkeypatch.setattr(actions, "COUNT_CAP", 3)
    DeadMessageFactory.create_batch(4)
    client = staff_client()
    url = reverse("admin:django_pgqueue_deadmessage_changelist")

    page = client.get(url)
    assert page.context["cl"].result_count == 3
    assert '<span class="pgq-capped"' in page.text
    assert ">3+</span> dead messages" in page.text

    narrowed = client.get(url, {"reason__exact": "error", "q": "no-such-task"})
    assert narrowed.context["cl"].result_count == 0
    assert "pgq-capped" not in narrowed.text


def test_a_retried_message_shows_its_last_error(staff_client: StaffClient) -> None:
    """A retry brings a dead message back without ``last_error``: its history still says it."""
    errors = [
        {"attempt": 1, "at": "t1", "type": "KeyError", "message": "first"},
        {"attempt": 2, "at": "t2", "type": "ValueError", "message": "the last one"},
    ]
    dead = DeadMessageFactory(errors=errors)
    operations.retry_dead([dead.message_id])

    page = staff_client().get(
        reverse("admin:django_pgqueue_message_change", args=[dead.message_id])
    )

    last_error = page.text.split("field-last_error_pretty")[1].split("field-errors_pretty")[0]
    assert "the last one" in last_error
    assert "—" not in last_error


@pytest.mark.parametrize(
    ("model", "factory", "column"),
    [
        ("message", MessageFactory, "available_at"),
        ("deadmessage", DeadMessageFactory, "died_at"),
        ("archivedmessage", ArchivedMessageFactory, "finished_at"),
    ],
)
def test_lists_show_one_message_id_and_times_to_the_second(
    staff_client: StaffClient, model: str, factory: Any, column: str
) -> None:
    when = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
    row = factory(**{column: when})

    page = staff_client().get(reverse(f"admin:django_pgqueue_{model}_changelist"))

    headers = re.findall(r'<th scope="col" class="([^"]*)"', page.text)
    id_columns = [h for h in headers if "column-id" in h or "message_id" in h or "number" in h]
    assert len(id_columns) == 1 and "column-message_number" in id_columns[0], id_columns
    # The list is newest first, which the one id column says.
    assert "sorted descending" in id_columns[0]
    message_id = row.pk if model == "message" else row.message_id
    assert f">{message_id}</a>" in page.text
    assert "2026-03-04 05:06:07" in page.text


def test_dead_list_reason_is_the_short_code_with_its_explanation(
    staff_client: StaffClient,
) -> None:
    DeadMessageFactory(
        reason=DeadReason.LEASE_EXPIRED,
        details={"type": "LeaseExpired", "message": "x" * 3000},
    )
    page = staff_client().get(reverse("admin:django_pgqueue_deadmessage_changelist")).text

    assert (
        '<span class="pgq-reason" title="lease expired on its last attempt">lease_expired' in page
    )
    # The whole (bounded) error is the title; the cell itself is cut by the stylesheet.
    assert '<span class="pgq-error" title="LeaseExpired: xxx' in page
    assert "django_pgqueue/admin.css" in page


@pytest.mark.parametrize(
    ("factory", "model"),
    [
        (MessageFactory, "message"),
        (ArchivedMessageFactory, "archivedmessage"),
        (DeadMessageFactory, "deadmessage"),
    ],
)
def test_message_pages_show_the_headers_escaped(
    staff_client: StaffClient, factory: Any, model: str
) -> None:
    row = factory(headers={"request-id": HOSTILE})
    client = staff_client()
    page = client.get(reverse(f"admin:django_pgqueue_{model}_change", args=[row.pk]))
    assert page.status_code == 200
    assert "request-id" in page.text and HOSTILE not in page.text
    plain = factory()
    page = client.get(reverse(f"admin:django_pgqueue_{model}_change", args=[plain.pk]))
    assert page.status_code == 200 and "request-id" not in page.text
