"""The live messages' Cancel action: behind ``cancel_message``, logged, reported per result."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse

from django_pgqueue.models import DeadMessage, Message
from tests.admin.conftest import StaffClient
from tests.factories import MessageFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_pgqueue_message_changelist"


def _post(client: Any, *pks: int) -> Any:
    return client.post(reverse(CHANGELIST), {"action": "cancel", "_selected_action": list(pks)})


def test_staff_without_the_permission_neither_sees_nor_forges_it(
    staff_client: StaffClient,
) -> None:
    message = MessageFactory()
    client = staff_client("discard_message")
    assert 'value="cancel"' not in client.get(reverse(CHANGELIST)).text
    _post(client, message.pk)
    assert Message.objects.filter(pk=message.pk).exists()
    assert not LogEntry.objects.exists()


def test_cancel_moves_the_idle_and_flags_the_running(staff_client: StaffClient) -> None:
    idle = MessageFactory()
    running = MessageFactory(leased=True)
    client = staff_client("cancel_message")
    assert 'value="cancel"' in client.get(reverse(CHANGELIST)).text

    response = _post(client, idle.pk, running.pk, 999_999)

    assert response.status_code == 302
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        "Cancelled 1; flagged 1 running (their handlers are told)."
    ]
    dead = DeadMessage.objects.get(message_id=idle.pk)
    assert dead.reason == "cancelled" and "in the admin" in dead.details["message"]
    assert Message.objects.get(pk=running.pk).cancel_requested_at is not None
    assert sorted(e.object_id for e in LogEntry.objects.all()) == sorted(
        [str(idle.pk), str(running.pk)]
    )
