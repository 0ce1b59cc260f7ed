from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings

from django_pgqueue.pipeline.models import QueueStatsHourly

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.pipeline.urls")]

HOUR = dt.datetime(2026, 10, 1, 12, tzinfo=dt.UTC)


@pytest.fixture
def staff_client() -> Client:
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_queuestatshourly"))
    client = Client()
    client.force_login(user)
    return client


def test_stats_page_is_staff_only(client: Client) -> None:
    User.objects.create_user("someone", password="pw")
    client.login(username="someone", password="pw")
    response = client.get("/pgqueue/stats/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_stats_page_needs_the_stats_view_permission(client: Client) -> None:
    User.objects.create_user("staff-only", is_staff=True)
    client.force_login(User.objects.get(username="staff-only"))
    assert client.get("/pgqueue/stats/").status_code == 403


def test_empty_stats_table_renders_a_hint(staff_client: Client) -> None:
    response = staff_client.get("/pgqueue/stats/?hours=abc")
    assert response.status_code == 200
    assert b"No statistics in this window yet" in response.content
    assert b"pgq-chart" not in response.content.replace(b".pgq-stats .pgq-chart", b"")


@override_settings(USE_TZ=True)
def test_stats_are_drawn_as_charts(staff_client: Client) -> None:
    QueueStatsHourly.objects.create(
        queue="emails", task="send", hour=HOUR - dt.timedelta(hours=1), processed=40,
        failed=3, dead=1, dead_by_reason={"timeout": 1}, wait_p95=0.5, run_p95=1.25,
        top_errors=[{"signature": "SMTPError: code N", "count": 3}],
    )  # fmt: skip
    QueueStatsHourly.objects.create(
        queue="emails", task="<script>x</script>", hour=HOUR, processed=60, dead=2,
        dead_by_reason={"error": 2}, wait_p95=2.0, run_p95=0.75,
        top_errors=[{"signature": "<b>boom</b>", "count": 5}],
    )  # fmt: skip
    QueueStatsHourly.objects.create(queue="other", task="t", hour=HOUR, processed=7)

    response = staff_client.get("/pgqueue/stats/?hours=24")

    body = response.content.decode()
    assert response.status_code == 200
    assert body.count('class="pgq-chart"') == 5  # throughput, failures, latency, reasons, errors
    assert "12:00: processed 67" in body and "12:00: dead 2" in body  # all queues
    assert "SMTPError: code N" in body and "timeout" in body
    assert "<script>x</script>" not in body and "&lt;b&gt;boom&lt;/b&gt;" in body

    only_other = staff_client.get("/pgqueue/stats/?queue=other").content.decode()
    assert "processed 7<" in only_other and "SMTPError" not in only_other


def test_the_pipeline_apps_admin_pages_render(client: Client) -> None:
    from django.urls import reverse

    from django_pgqueue.pipeline.models import ExportRange, ExportRun

    run = ExportRun.objects.create(destination="/data/export")
    ExportRange.objects.create(run=run, destination="/data/export", source="archive", lo=1, hi=9)
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    pages = [reverse("admin:app_list", args=["django_pgqueue_pipeline"])]
    pages += [
        reverse(f"admin:django_pgqueue_pipeline_{model}_changelist")
        for model in ("exportrun", "exportrange", "queuestatshourly")
    ]
    for page in pages:
        response = client.get(page)
        assert response.status_code == 200, page
    assert "Queue statistics" in client.get(pages[-1]).text
    assert "/data/export" in client.get(pages[1]).text
