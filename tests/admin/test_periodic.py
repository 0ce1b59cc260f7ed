"""The periodic schedules' admin: last / next run, in the code or not, pause, Run now."""

from __future__ import annotations

import datetime as dt
import importlib
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from django_pgqueue.models import Message, PeriodicSchedule
from django_pgqueue.periodic import Schedule
from tests.admin.conftest import StaffClient

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_pgqueue_periodicschedule_changelist"
periodic_module = importlib.import_module("django_pgqueue.periodic")


@pytest.fixture
def declared(monkeypatch: Any) -> PeriodicSchedule:
    schedule = Schedule(name="nightly", task="tests.echo", cron="0 3 * * *", queue="reports")
    monkeypatch.setattr(periodic_module, "_SCHEDULES", {"nightly": schedule})
    PeriodicSchedule.objects.create(
        name="gone", task="tests.echo", queue="reports", spec="every 60s",
        next_run_at=timezone.now() + dt.timedelta(minutes=1),
    )  # fmt: skip
    return PeriodicSchedule.objects.create(
        name="nightly", task="tests.echo", queue="reports", spec=schedule.spec,
        next_run_at=timezone.now() + dt.timedelta(hours=5),
    )  # fmt: skip


def _post(client: Any, action: str, *names: str) -> Any:
    return client.post(reverse(CHANGELIST), {"action": action, "_selected_action": list(names)})


def _messages(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_view_only_staff_see_the_schedules_but_no_action(
    staff_client: StaffClient, declared: PeriodicSchedule
) -> None:
    client = staff_client("view_periodicschedule")
    page = client.get(reverse(CHANGELIST))
    assert page.status_code == 200
    assert "nightly" in page.text and "gone" in page.text and "0 3 * * *" in page.text
    for action in ("pause", "resume", "run_now"):
        assert f'value="{action}"' not in page.text
    _post(client, "pause", "nightly")
    _post(client, "run_now", "nightly")
    assert not PeriodicSchedule.objects.get(name="nightly").paused
    assert not Message.objects.exists() and not LogEntry.objects.exists()


def test_pause_and_resume(staff_client: StaffClient, declared: PeriodicSchedule) -> None:
    client = staff_client("view_periodicschedule", "pause_periodicschedule")
    assert _messages(_post(client, "pause", "nightly")) == ["Paused 1 schedule(s)."]
    assert PeriodicSchedule.objects.get(name="nightly").paused
    assert _messages(_post(client, "resume", "nightly"))[-1] == "Resumed 1 schedule(s)."
    assert not PeriodicSchedule.objects.get(name="nightly").paused
    assert LogEntry.objects.count() == 2


def test_run_now_enqueues_one_message_and_keeps_the_slots(
    staff_client: StaffClient, declared: PeriodicSchedule
) -> None:
    client = staff_client("view_periodicschedule", "run_periodicschedule")
    response = _post(client, "run_now", "nightly", "gone")
    assert _messages(response) == ["Enqueued 1 run(s) now. Skipped gone: not declared in the code."]
    [message] = Message.objects.all()
    assert (message.task, message.queue) == ("tests.echo", "reports")
    assert message.payload["periodic"] == "nightly"
    row = PeriodicSchedule.objects.get(name="nightly")
    assert row.last_message_id == message.id and row.next_run_at == declared.next_run_at
