"""The archive's admin pages over rows in several day partitions and the DEFAULT one."""

from __future__ import annotations

import datetime as dt

import pytest
from django.urls import reverse

from django_pgqueue.models import ArchivedMessage, Message
from tests.factories import ArchivedMessageFactory

from .conftest import StaffClient

pytestmark = pytest.mark.django_db


def test_archive_list_change_page_search_and_requeue_span_partitions(
    staff_client: StaffClient,
) -> None:
    now = dt.datetime.now(dt.UTC)
    rows = [
        ArchivedMessageFactory(finished_at=now),  # today's partition
        ArchivedMessageFactory(finished_at=now + dt.timedelta(days=1)),  # tomorrow's
        ArchivedMessageFactory(finished_at=now - dt.timedelta(days=900)),  # DEFAULT
    ]
    client = staff_client("requeue_archivedmessage")
    listing = client.get(reverse("admin:django_pgqueue_archivedmessage_changelist"))
    assert listing.status_code == 200
    for row in rows:
        assert f">{row.message_id}</a>" in listing.text
        page = client.get(reverse("admin:django_pgqueue_archivedmessage_change", args=[row.pk]))
        assert page.status_code == 200 and str(row.message_id) in page.text
    found = client.get(
        reverse("admin:django_pgqueue_archivedmessage_changelist"),
        {"q": str(rows[2].message_id)},
    )
    assert f">{rows[2].message_id}</a>" in found.text
    assert f">{rows[0].message_id}</a>" not in found.text

    client.post(
        reverse("admin:django_pgqueue_archivedmessage_changelist"),
        {"action": "requeue", "_selected_action": [r.pk for r in rows]},
    )
    assert Message.objects.count() == 3
    assert ArchivedMessage.objects.count() == 3
