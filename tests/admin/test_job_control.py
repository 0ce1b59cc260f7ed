"""The live message page shows job control: a running message's progress, its snoozes and
its debounce key."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.admin.conftest import StaffClient
from tests.factories import MessageFactory, MessageProgressFactory

pytestmark = pytest.mark.django_db


def test_the_live_message_page_shows_a_running_messages_progress(
    staff_client: StaffClient,
) -> None:
    message = MessageFactory(leased=True, snoozes=2, debounce_key="document:7")
    MessageProgressFactory(message_id=message.id)
    page = staff_client().get(reverse("admin:django_pgqueue_message_change", args=[message.pk]))
    text = page.content.decode()
    assert page.status_code == 200
    assert "3/10 (30%) copying rows" in text
    assert "document:7" in text


def test_a_waiting_message_shows_no_progress(staff_client: StaffClient) -> None:
    message = MessageFactory()
    MessageProgressFactory(message_id=message.id)  # left by a run that was released
    page = staff_client().get(reverse("admin:django_pgqueue_message_change", args=[message.pk]))
    assert "copying rows" not in page.content.decode()
