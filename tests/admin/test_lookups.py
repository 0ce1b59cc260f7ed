"""The change lists take from the URL only the filters they offer, and the admin's reads stop
after ``ADMIN_STATEMENT_TIMEOUT`` (issue #58): a URL cannot make a page scan a big table for
as long as it likes."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from django_pgqueue.models import DeadReason
from django_pgqueue.pipeline.models import STATS_TABLE
from tests.admin.conftest import StaffClient
from tests.factories import ArchivedMessageFactory, DeadMessageFactory, MessageFactory

CHANGELISTS = [
    "message",
    "archivedmessage",
    "deadmessage",
    "workerheartbeat",
    "periodicschedule",
]


@pytest.mark.django_db
@pytest.mark.parametrize("model", CHANGELISTS)
@pytest.mark.parametrize(
    "lookup",
    ["payload__pad__icontains", "task__regex", "queue__contains", "id__gt", "pk", "errors"],
)
def test_a_lookup_the_list_does_not_offer_is_refused(
    staff_client: StaffClient, model: str, lookup: str
) -> None:
    client = staff_client("view_periodicschedule")
    page = client.get(reverse(f"admin:django_pgqueue_{model}_changelist"), {lookup: "x"})
    assert page.status_code == 400


@pytest.mark.django_db
def test_the_offered_filters_still_work_from_the_url(staff_client: StaffClient) -> None:
    dead = DeadMessageFactory(queue="emails", task="send", reason=DeadReason.TIMEOUT)
    DeadMessageFactory(queue="emails", task="send", reason=DeadReason.ERROR)
    live = MessageFactory(queue="emails", task="send")
    archived = ArchivedMessageFactory(queue="emails", task="send")
    client = staff_client("view_periodicschedule")
    an_hour_ago = (timezone.now() - dt.timedelta(hours=1)).isoformat()
    soon = (timezone.now() + dt.timedelta(hours=1)).isoformat()

    def ids(model: str, **params: str) -> set[int]:
        page = client.get(reverse(f"admin:django_pgqueue_{model}_changelist"), params)
        assert page.status_code == 200
        return {obj.pk for obj in page.context["cl"].result_list}

    assert ids(
        "deadmessage",
        queue="emails",
        task="send",
        reason__exact="timeout",
        died_at__gte=an_hour_ago,
        died_at__lt=soon,
        q=str(dead.message_id),
    ) == {dead.pk}
    assert ids("message", queue="emails", task="send", state="ready", enqueued_at__gte=an_hour_ago)
    assert ids("message", queue="emails", task="send") == {live.pk}
    assert ids("archivedmessage", finished_at__lt=soon, o="-1", p="0") == {archived.pk}
    assert ids("periodicschedule", paused__exact="0", queue="emails") == set()


@contextmanager
def lock_held_on(tables: str) -> Iterator[None]:
    """Another session holds ``tables`` locked against reads for the whole block: a read of
    them that returns inside it was stopped by its statement timeout."""
    settings = connection.settings_dict
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with psycopg.connect(
            host=settings["HOST"] or "127.0.0.1",
            port=settings["PORT"] or 5432,
            user=settings["USER"],
            dbname=settings["NAME"],
        ) as conn:
            conn.execute(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE")
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(10)
    try:
        yield
    finally:
        release.set()
        holder.join(10)


@pytest.mark.django_db(transaction=True)
def test_an_admin_read_past_the_statement_timeout_stops_with_a_clear_page(
    staff_client: StaffClient, settings
) -> None:
    DeadMessageFactory()
    settings.PGQUEUE = {**settings.PGQUEUE, "ADMIN_STATEMENT_TIMEOUT": 0.2}
    client = staff_client()
    url = reverse("admin:django_pgqueue_deadmessage_changelist")
    with lock_held_on("pgqueue_dead"):
        page = client.get(url)

    assert page.status_code == 503
    assert "ADMIN_STATEMENT_TIMEOUT" in page.text and "0.2" in page.text


@pytest.mark.django_db(transaction=True)
def test_the_statement_timeout_covers_message_pages_the_dashboard_and_the_stats(
    staff_client: StaffClient, settings
) -> None:
    message = MessageFactory()
    settings.PGQUEUE = {**settings.PGQUEUE, "ADMIN_STATEMENT_TIMEOUT": 0.2}
    client = staff_client("view_queuestatshourly")
    with lock_held_on(f"pgqueue_message, {STATS_TABLE}"):
        pages = [
            client.get(reverse("admin:django_pgqueue_message_change", args=[message.pk])),
            client.get(reverse("admin:django_pgqueue_queuestate_changelist")),
            client.get(reverse("admin:django_pgqueue_pipeline_queuestatshourly_changelist")),
        ]

    assert [page.status_code for page in pages] == [503, 503, 503]
