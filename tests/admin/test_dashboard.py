"""The dashboard page and its pause / resume / purge views, each behind its permission."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_pgqueue.admin.compat import CHANGE_FORM_ACTIONS
from django_pgqueue.models import DeadMessage, Message, QueueState
from tests.admin.conftest import StaffClient
from tests.factories import (
    DeadMessageFactory,
    MessageFactory,
    QueueStateFactory,
    WorkerHeartbeatFactory,
)

pytestmark = pytest.mark.django_db

DASHBOARD = "admin:django_pgqueue_queuestate_changelist"
PAST = dt.timedelta(minutes=1)


def test_dashboard_shows_queues_workers_and_state(staff_client: StaffClient) -> None:
    MessageFactory.create_batch(2, queue="emails", available_at=timezone.now() - PAST)
    DeadMessageFactory(queue="emails")
    QueueStateFactory(name="reports", paused=True)
    WorkerHeartbeatFactory(
        worker_id="web-1:42",
        queues=["reports", "emails"],
        stats={"running": 3, "rate": 1.5, "dead": 1, "processed": 1700, "failed": 2},
    )

    page = staff_client().get(reverse(DASHBOARD))

    assert page.status_code == 200
    queues = {q.name: q for q in page.context["overview"].queues}
    assert str(queues["emails"].ready) == "2"
    assert str(queues["emails"].dead) == "1"
    assert queues["reports"].paused
    assert 'data-queue="emails"' in page.text
    assert "web-1:42" in page.text
    # Activity in reading order (known counters first, then the rest by name), queues sorted.
    workers = page.text[page.text.index('id="pgq-workers"') :]
    labels = ["processed", "failed", "dead", "rate (msg/s)", "running"]
    positions = [workers.index(f"<th>{label}</th>") for label in labels]
    assert positions == sorted(positions)
    assert '<td class="num">1,700</td>' in workers
    assert "emails, reports" in workers
    assert "{" not in workers.split("</table>")[0]
    # View permission only: no buttons that would fail.
    assert 'class="button pgq-pause"' not in page.text
    assert 'class="button pgq-purge"' not in page.text


def test_dashboard_needs_the_queue_view_permission(staff_client: StaffClient) -> None:
    client = staff_client("view_message", view=False)
    assert client.get(reverse(DASHBOARD)).status_code == 403


def reads(captured: CaptureQueriesContext) -> list[dict[str, str]]:
    frame = ("SAVEPOINT", "RELEASE SAVEPOINT", "SELECT set_config('statement_timeout'")
    return [q for q in captured.captured_queries if not q["sql"].startswith(frame)]


def test_dashboard_statement_count_is_bounded(staff_client: StaffClient) -> None:
    client = staff_client()
    MessageFactory(queue="q0")
    client.get(reverse(DASHBOARD))  # warm caches (content types, session)
    with CaptureQueriesContext(connection) as small:
        client.get(reverse(DASHBOARD))
    for n in range(1, 12):
        MessageFactory.create_batch(4, queue=f"q{n}")
        DeadMessageFactory.create_batch(2, queue=f"q{n}")
    with CaptureQueriesContext(connection) as large:
        client.get(reverse(DASHBOARD))

    # Not counted: the page's reads run in a transaction under a statement timeout (in a
    # test, a savepoint and its release).
    small_reads, large_reads = reads(small), reads(large)
    assert len(small_reads) == len(large_reads) <= 10
    for query in large_reads:
        sql = query["sql"].upper()
        assert "COUNT(*)" not in sql or "LIMIT" in sql, sql


@pytest.mark.parametrize("view", ["pause", "resume"])
def test_pause_and_resume_need_the_permission(staff_client: StaffClient, view: str) -> None:
    QueueStateFactory(name="emails", paused=view == "resume")
    url = reverse(f"admin:django_pgqueue_queue_{view}")

    assert staff_client().post(url, {"queue": "emails"}).status_code == 403
    assert QueueState.objects.get(name="emails").paused is (view == "resume")
    assert not LogEntry.objects.exists()

    for client in (staff_client("pause_queue"), staff_client(superuser=True)):
        response = client.post(url, {"queue": "emails"})
        assert response.status_code == 302
        assert QueueState.objects.get(name="emails").paused is (view == "pause")
    assert LogEntry.objects.filter(object_id="emails").count() == 2


def test_pause_is_post_only_and_validates_the_queue(staff_client: StaffClient) -> None:
    client = staff_client("pause_queue")
    assert client.get(reverse("admin:django_pgqueue_queue_pause")).status_code == 405
    bad = client.post(reverse("admin:django_pgqueue_queue_pause"), {"queue": "Bad Name!"})
    assert bad.status_code == 400
    assert not QueueState.objects.exists()


def test_pause_buttons_show_for_permitted_staff(staff_client: StaffClient) -> None:
    QueueStateFactory(name="emails", paused=True)
    QueueStateFactory(name="reports", paused=False)
    page = staff_client("pause_queue").get(reverse(DASHBOARD))
    assert page.text.count('class="button pgq-resume"') == 1
    assert page.text.count('class="button pgq-pause"') == 1


def test_purge_needs_permission_and_confirmation(staff_client: StaffClient) -> None:
    MessageFactory.create_batch(3, queue="emails")
    MessageFactory(queue="reports")
    DeadMessageFactory(queue="emails")
    url = reverse("admin:django_pgqueue_queue_purge")

    viewer = staff_client()
    assert viewer.get(url, {"queue": "emails"}).status_code == 403
    assert viewer.post(url, {"queue": "emails", "confirm": "yes"}).status_code == 403
    assert Message.objects.filter(queue="emails").count() == 3

    operator = staff_client("purge_queue")
    confirmation = operator.get(url, {"queue": "emails"})
    assert confirmation.status_code == 200
    assert "Yes, purge queue emails" in confirmation.text
    # A post without the confirmation field only shows the page again.
    assert operator.post(url, {"queue": "emails"}).status_code == 200
    assert Message.objects.filter(queue="emails").count() == 3

    done = operator.post(url, {"queue": "emails", "confirm": "yes"})
    assert done.status_code == 302
    assert [str(m) for m in get_messages(done.wsgi_request)] == [
        "Purged 3 live messages from queue emails."
    ]
    assert not Message.objects.filter(queue="emails").exists()
    assert Message.objects.filter(queue="reports").count() == 1
    assert DeadMessage.objects.count() == 1
    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.get_change_message()) == ("emails", "Purged 3 live messages.")


def test_history_link_when_the_pipeline_is_installed(staff_client: StaffClient) -> None:
    page = staff_client("view_queuestatshourly").get(reverse(DASHBOARD))
    url = page.context["history_url"]
    assert url == reverse("admin:django_pgqueue_pipeline_queuestatshourly_changelist")
    assert 'id="pgq-history"' in page.text
    charts = staff_client("view_queuestatshourly").get(url)
    assert charts.status_code == 200 and "Queue statistics" in charts.text
    # Staff who may see the queues but not the stats: no link, and 403 by the URL.
    without = staff_client()
    assert without.get(reverse(DASHBOARD)).context["history_url"] is None
    assert without.get(url).status_code == 403
    assert staff_client("view_message", view=False).get(url).status_code == 403


def test_history_link_absent_without_the_pipeline(
    staff_client: StaffClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_pgqueue.admin import dashboard

    # What a project without the pipeline app has: no such admin page to reverse.
    monkeypatch.setattr(dashboard, "HISTORY_URL_NAME", "admin:no_such_app_stats_changelist")
    page = staff_client("view_queuestatshourly").get(reverse(DASHBOARD))
    assert page.status_code == 200 and page.context["history_url"] is None
    assert 'id="pgq-history"' not in page.text


def test_auto_refresh_only_with_an_offered_period(staff_client: StaffClient) -> None:
    client = staff_client()
    assert 'http-equiv="refresh"' not in client.get(reverse(DASHBOARD)).text
    page = client.get(reverse(DASHBOARD), {"refresh": "15"})
    assert '<meta http-equiv="refresh" content="15">' in page.text
    for bad in ("1", "abc", "-5"):
        assert 'http-equiv="refresh"' not in client.get(reverse(DASHBOARD), {"refresh": bad}).text


@pytest.mark.urls("tests.admin.custom_site_urls")
def test_works_on_another_admin_site(staff_client: StaffClient) -> None:
    dead = DeadMessageFactory()
    client = staff_client("retry_deadmessage", "pause_queue")

    assert client.get("/ops/django_pgqueue/queuestate/").status_code == 200
    paused = client.post("/ops/django_pgqueue/queuestate/pause/", {"queue": "default"})
    assert paused["Location"] == "/ops/django_pgqueue/queuestate/"
    if CHANGE_FORM_ACTIONS:  # Django 6.1+: the Retry button of the dead message page
        retried = client.post(
            f"/ops/django_pgqueue/deadmessage/{dead.pk}/change/",
            {"CHANGE_FORM-action": "retry_dead", "_selected_action": dead.pk, "index": 0},
        )
        assert retried["Location"] == f"/ops/django_pgqueue/message/{dead.message_id}/change/"


def test_superuser_sees_every_button_and_may_purge(staff_client: StaffClient) -> None:
    MessageFactory.create_batch(2, queue="emails")
    client = staff_client(superuser=True)
    page = client.get(reverse(DASHBOARD))
    assert 'class="button pgq-pause"' in page.text
    assert 'class="button pgq-purge"' in page.text
    response = client.post(
        reverse("admin:django_pgqueue_queue_purge"), {"queue": "emails", "confirm": "yes"}
    )
    assert response.status_code == 302
    assert not Message.objects.exists()


def test_counts_link_to_their_filtered_lists(staff_client: StaffClient) -> None:
    MessageFactory.create_batch(2, queue="emails", available_at=timezone.now() - PAST)
    page = staff_client().get(reverse(DASHBOARD)).text
    live = reverse("admin:django_pgqueue_message_changelist")
    row = page[page.index('data-queue="emails"') :].split("</tr>")[0]
    for state, css in [
        ("ready", "pgq-ready"),
        ("scheduled", "pgq-scheduled"),
        ("in_flight", "pgq-in-flight"),
        ("retrying", "pgq-retrying"),
    ]:
        assert f'class="num {css}"><a href="{live}?queue=emails&amp;state={state}">' in row
    # Each state link lists exactly what the dashboard counted.
    listed = staff_client().get(live, {"queue": "emails", "state": "ready"})
    assert listed.context["cl"].result_count == 2
