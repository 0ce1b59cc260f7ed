"""Every action behind its own permission: hidden from and unforgeable by view-only staff,
done by permitted staff and superusers, logged per object, reported with skips."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_pgqueue.admin.compat import CHANGE_FORM_ACTIONS
from django_pgqueue.models import ArchivedMessage, DeadMessage, DeadReason, Message
from tests.admin.conftest import StaffClient, make_staff
from tests.factories import ArchivedMessageFactory, DeadMessageFactory, MessageFactory

pytestmark = pytest.mark.django_db


@dataclass
class Case:
    model: str
    action: str
    permission: str
    make: Callable[[], Any]
    # A snapshot of what the action changes; equal before and after means "nothing happened".
    snapshot: Callable[[Any], Any]
    done_text: str


def _live(obj: Any) -> Any:
    return list(Message.objects.filter(pk=obj.pk).values_list("available_at", "lease_token"))


def _live_or_dead(message_id: int) -> tuple[bool, bool]:
    """Whether the message is live, whether it is dead: a discard or a retry moves it."""
    return (
        Message.objects.filter(pk=message_id).exists(),
        DeadMessage.objects.filter(message_id=message_id).exists(),
    )


CASES = [
    Case(
        "message",
        "retry_now",
        "retry_now_message",
        lambda: MessageFactory(available_at=timezone.now() + dt.timedelta(hours=1)),
        _live,
        "Made available now: 1 live message.",
    ),
    Case(
        "message",
        "release_leases",
        "release_message",
        lambda: MessageFactory(leased=True),
        _live,
        "Released the leases of 1 live message.",
    ),
    Case(
        "message",
        "discard",
        "discard_message",
        lambda: MessageFactory(),
        lambda obj: _live_or_dead(obj.pk),
        "Discarded 1 live message.",
    ),
    Case(
        "deadmessage",
        "retry_dead",
        "retry_deadmessage",
        lambda: DeadMessageFactory(),
        lambda obj: _live_or_dead(obj.message_id),
        "Retried 1 dead message.",
    ),
    Case(
        "archivedmessage",
        "requeue",
        "requeue_archivedmessage",
        lambda: ArchivedMessageFactory(),
        lambda obj: Message.objects.filter(task=obj.task).count(),
        "Requeued 1 archived message.",
    ),
]
IDS = [case.action for case in CASES]


def _changelist(case: Case) -> str:
    return reverse(f"admin:django_pgqueue_{case.model}_changelist")


def _post_action(client: Client, case: Case, pk: int) -> Any:
    return client.post(_changelist(case), {"action": case.action, "_selected_action": [pk]})


def _messages(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_view_only_staff_neither_sees_nor_forges_the_action(
    staff_client: StaffClient, case: Case
) -> None:
    obj = case.make()
    before = case.snapshot(obj)
    client = staff_client()

    page = client.get(_changelist(case))
    assert page.status_code == 200
    assert f'value="{case.action}"' not in page.text

    forged = _post_action(client, case, obj.pk)
    assert forged.status_code in (200, 302, 403)
    assert case.snapshot(obj) == before
    assert not LogEntry.objects.exists()

    # The change form action path is closed too.
    change_url = reverse(f"admin:django_pgqueue_{case.model}_change", args=[obj.pk])
    forged_form = client.post(
        change_url, {"CHANGE_FORM-action": case.action, "_selected_action": obj.pk, "index": 0}
    )
    assert forged_form.status_code in (400, 403)
    assert case.snapshot(obj) == before


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("who", ["permitted", "superuser"])
def test_permitted_staff_and_superusers_run_the_action(
    staff_client: StaffClient, case: Case, who: str
) -> None:
    obj = case.make()
    before = case.snapshot(obj)
    client = staff_client(case.permission) if who == "permitted" else staff_client(superuser=True)

    page = client.get(_changelist(case))
    assert f'value="{case.action}"' in page.text

    response = _post_action(client, case, obj.pk)
    assert response.status_code == 302
    assert case.snapshot(obj) != before
    assert _messages(response) == [case.done_text]
    entry = LogEntry.objects.get()
    assert entry.object_id == str(obj.pk)
    assert entry.get_change_message()


def test_other_permissions_do_not_open_an_action(staff_client: StaffClient) -> None:
    message = MessageFactory(available_at=timezone.now() + dt.timedelta(hours=1))
    before = _live(message)
    client = staff_client("discard_message", "release_message", "purge_queue")

    page = client.get(reverse("admin:django_pgqueue_message_changelist"))
    assert 'value="discard"' in page.text
    assert 'value="retry_now"' not in page.text
    client.post(
        reverse("admin:django_pgqueue_message_changelist"),
        {"action": "retry_now", "_selected_action": [message.pk]},
    )
    assert _live(message) == before


def test_skipped_rows_are_counted_and_explained(staff_client: StaffClient) -> None:
    ready = MessageFactory(available_at=timezone.now() - dt.timedelta(minutes=1))  # nothing to do
    scheduled = MessageFactory(available_at=timezone.now() + dt.timedelta(hours=1))
    leased = MessageFactory(leased=True)  # a worker holds it: not touched
    client = staff_client("retry_now_message")

    response = client.post(
        reverse("admin:django_pgqueue_message_changelist"),
        {"action": "retry_now", "_selected_action": [ready.pk, scheduled.pk, leased.pk]},
    )

    assert _messages(response) == [
        "Made available now: 1 live message. Skipped 2: leased by a worker, already "
        "available, or no longer live."
    ]
    assert LogEntry.objects.get().object_id == str(scheduled.pk)


def test_retry_resets_attempts_and_keeps_the_message_id(staff_client: StaffClient) -> None:
    dead = DeadMessageFactory(attempts=3, reason=DeadReason.ERROR, payload={"k": 1})
    staff_client("retry_deadmessage").post(
        reverse("admin:django_pgqueue_deadmessage_changelist"),
        {"action": "retry_dead", "_selected_action": [dead.pk]},
    )
    live = Message.objects.get(pk=dead.message_id)
    assert (live.attempts, live.payload, live.task) == (0, {"k": 1}, dead.task)
    assert not DeadMessage.objects.exists()


def test_requeue_makes_a_new_message_and_keeps_the_archive(staff_client: StaffClient) -> None:
    archived = ArchivedMessageFactory(payload={"again": True})
    staff_client("requeue_archivedmessage").post(
        reverse("admin:django_pgqueue_archivedmessage_changelist"),
        {"action": "requeue", "_selected_action": [archived.pk]},
    )
    new = Message.objects.get()
    assert new.pk != archived.message_id
    assert new.payload == {"again": True}
    assert ArchivedMessage.objects.filter(pk=archived.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_make_exactly_one_live_message(
    admin_conn: psycopg.Connection[Any],
) -> None:
    """Two operators post Retry for the same dead message while a third session holds its
    row: both statements queue behind the lock, so they really run at the same moment."""
    dead = DeadMessageFactory()
    users = [make_staff(f"op{i}", "view_deadmessage", "retry_deadmessage") for i in range(2)]
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def retry(user: Any) -> None:
        try:
            client = Client()
            client.force_login(user)
            response = client.post(
                reverse("admin:django_pgqueue_deadmessage_changelist"),
                {"action": "retry_dead", "_selected_action": [dead.pk]},
            )
            results.append(_messages(response))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=retry, args=(user,)) for user in users]
    with admin_conn.transaction():
        admin_conn.execute("SELECT 1 FROM pgqueue_dead WHERE id = %s FOR UPDATE", [dead.pk])
        for thread in threads:
            thread.start()
        _wait_for_lock_waiters(admin_conn, 2)
    for thread in threads:
        thread.join(timeout=30)

    assert not errors
    assert Message.objects.filter(pk=dead.message_id).count() == 1
    assert not DeadMessage.objects.exists()
    assert LogEntry.objects.count() == 1
    texts = sorted(text for messages in results for text in messages)
    assert texts == [
        "Retried 0 dead messages. Skipped 1: already retried by someone else, or a live "
        "message holds the same dedup key.",
        "Retried 1 dead message.",
    ]


def _wait_for_lock_waiters(conn: psycopg.Connection[Any], count: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        # Inside a transaction pg_stat_activity is a snapshot: refresh it on every look.
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
        if row is not None and row[0] >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"{count} sessions never queued behind the row lock")


needs_change_form_actions = pytest.mark.skipif(
    not CHANGE_FORM_ACTIONS, reason="actions on the change form are Django 6.1's"
)


@needs_change_form_actions
def test_retry_button_on_the_dead_message_page(staff_client: StaffClient) -> None:
    dead = DeadMessageFactory()
    url = reverse("admin:django_pgqueue_deadmessage_change", args=[dead.pk])

    assert 'class="historylink pgq-retry"' not in staff_client().get(url).text

    operator = staff_client("retry_deadmessage")
    page = operator.get(url)
    assert 'class="historylink pgq-retry"' in page.text
    response = operator.post(
        url, {"CHANGE_FORM-action": "retry_dead", "_selected_action": dead.pk, "index": 0}
    )
    assert response.status_code == 302
    assert response["Location"] == reverse(
        "admin:django_pgqueue_message_change", args=[dead.message_id]
    )
    assert Message.objects.filter(pk=dead.message_id).exists()


@pytest.mark.skipif(CHANGE_FORM_ACTIONS, reason="Django 6.1 offers actions on the change form")
def test_before_django_61_the_dead_message_page_has_no_retry_button(
    staff_client: StaffClient,
) -> None:
    dead = DeadMessageFactory()
    url = reverse("admin:django_pgqueue_deadmessage_change", args=[dead.pk])
    page = staff_client("retry_deadmessage").get(url)
    assert page.status_code == 200
    assert 'class="historylink pgq-retry"' not in page.text


@needs_change_form_actions
def test_discard_from_the_message_page_returns_to_the_list(staff_client: StaffClient) -> None:
    message = MessageFactory()
    url = reverse("admin:django_pgqueue_message_change", args=[message.pk])
    response = staff_client("discard_message").post(
        url, {"CHANGE_FORM-action": "discard", "_selected_action": message.pk, "index": 0}
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:django_pgqueue_message_changelist")
    dead = DeadMessage.objects.get(message_id=message.pk)
    assert dead.reason == DeadReason.DISCARDED
    assert dead.details["message"].startswith("discarded by staff")


def test_a_run_is_bounded_and_says_so(
    staff_client: StaffClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_pgqueue.admin import actions

    monkeypatch.setattr(actions, "ACTION_LIMIT", 2)
    dead = DeadMessageFactory.create_batch(3)
    response = staff_client("retry_deadmessage").post(
        reverse("admin:django_pgqueue_deadmessage_changelist"),
        {"action": "retry_dead", "select_across": "1", "_selected_action": [dead[0].pk]},
    )
    assert _messages(response) == [
        "Retried 2 dead messages. Only the first 2 selected were processed; "
        "run the action again for the rest."
    ]
    assert DeadMessage.objects.count() == 1


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_run_reads_ids_only_and_acts_in_batches(
    staff_client: StaffClient, monkeypatch: pytest.MonkeyPatch, case: Case
) -> None:
    """The selection is read as ids and labels (never payloads, results or errors) and the
    operation runs one statement per ACTION_BATCH ids."""
    from django_pgqueue.admin import actions

    monkeypatch.setattr(actions, "ACTION_BATCH", 4, raising=False)
    rows = [case.make() for _ in range(10)]
    client = staff_client(case.permission)
    with CaptureQueriesContext(connection) as queries:
        response = client.post(
            _changelist(case),
            {"action": case.action, "select_across": "1", "_selected_action": [rows[0].pk]},
        )
    assert _messages(response) == [case.done_text.replace(" 1 ", " 10 ").replace("e.", "es.")]
    selections = [
        q["sql"]
        for q in queries.captured_queries
        if "LIMIT 10001" in q["sql"] and "COUNT(" not in q["sql"]
    ]
    assert len(selections) == 1
    for column in ("payload", "errors", "result", "details", "last_error"):
        assert f'."{column}"' not in selections[0], selections[0]
    statement = {
        "retry_now": "UPDATE pgqueue_message SET available_at",
        "release_leases": "UPDATE pgqueue_message\nSET available_at",
        "discard": "DELETE FROM pgqueue_message WHERE id",
        "retry_dead": "DELETE FROM pgqueue_dead",
        "requeue": "FROM pgqueue_archive WHERE id",
    }[case.action]
    assert sum(statement in q["sql"] for q in queries.captured_queries) == 3  # 4 + 4 + 2


def test_log_entries_name_the_message_id(staff_client: StaffClient) -> None:
    """The admin log and the page titles name a message by the id it keeps in every table."""
    dead = DeadMessageFactory(task="emails.send", queue="emails")
    client = staff_client("retry_deadmessage")
    page = client.get(reverse("admin:django_pgqueue_deadmessage_change", args=[dead.pk]))
    assert f"emails.send #{dead.message_id} on emails" in page.text

    _post_action(client, CASES[3], dead.pk)

    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.object_repr) == (
        str(dead.pk),
        f"emails.send #{dead.message_id} on emails",
    )
