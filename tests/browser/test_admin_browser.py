"""A real headless Chromium, driven by Playwright, against the example project's admin on a
live server: log in, read the dashboard, filter the dead letters, retry, see them live; and
check that what the pages say can be trusted and fits the screen.

Screenshots go to ``test-artifacts/screenshots/`` (git-ignored, kept by CI as artifacts; the
path is printed); docs/img/admin-dashboard.png is one of them.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from django_pgqueue.models import DeadMessage, DeadReason, Message
from tests.admin.conftest import VIEW_PERMISSIONS, make_staff
from tests.factories import (
    ArchivedMessageFactory,
    DeadMessageFactory,
    MessageFactory,
    QueueStateFactory,
    WorkerHeartbeatFactory,
)

playwright_sync = pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = os.environ.get("PGQUEUE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
HOSTILE = "<img src=x onerror=alert(1)>"


def in_browser(steps: Callable[[Any], None]) -> None:
    """Run ``steps(page)`` in a headless Chromium on a helper thread.

    Playwright's sync API keeps an asyncio loop running in its thread; Django's ORM refuses
    to run there, so the test thread keeps the database and the helper keeps the browser.
    """
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/system-deps.sh (installs chromium)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots: {ARTIFACTS}")

    def run() -> None:
        with playwright_sync.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                page = context.new_page()
                page.set_default_timeout(15_000)
                steps(page)
            finally:
                browser.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(run).result(timeout=240)


def _seed() -> dict[str, Any]:
    now = timezone.now()
    MessageFactory.create_batch(3, queue="emails", available_at=now - dt.timedelta(minutes=2))
    MessageFactory(queue="emails", available_at=now + dt.timedelta(hours=1))
    MessageFactory(queue="emails", leased=True)
    MessageFactory.create_batch(2, queue="reports", available_at=now - dt.timedelta(seconds=30))
    ArchivedMessageFactory.create_batch(5, queue="emails")
    QueueStateFactory(name="reports", paused=True)
    WorkerHeartbeatFactory(
        worker_id="web-1:4242", hostname="web-1", queues=["emails", "reports"], stats={"done": 17}
    )
    timed_out = DeadMessageFactory(
        queue="emails",
        task="emails.send",
        reason=DeadReason.TIMEOUT,
        payload={"to": "ann@example.com", "note": HOSTILE},
        details={"type": "TimeoutError", "message": "took 31 s", "traceback": "Traceback ..."},
    )
    errored = DeadMessageFactory(queue="emails", task="emails.send", reason=DeadReason.ERROR)
    DeadMessageFactory(queue="reports", task="reports.build", reason=DeadReason.ERROR)
    operator = make_staff("operator", *VIEW_PERMISSIONS, "retry_deadmessage", "pause_queue")
    operator.set_password("a-long-test-password")
    operator.save()
    return {"timed_out": timed_out, "errored": errored}


def test_operator_filters_dead_messages_and_retries_them(live_server: Any) -> None:
    rows = _seed()
    timed_out, errored = rows["timed_out"], rows["errored"]
    dialogs: list[str] = []

    def steps(page: Any) -> None:
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))

        # Log in, landing on the dashboard.
        page.goto(f"{live_server.url}/admin/login/?next=/admin/django_pgqueue/queuestate/")
        page.fill("#id_username", "operator")
        page.fill("#id_password", "a-long-test-password")
        page.click("input[type=submit]")
        page.wait_for_selector("#pgq-queues")
        emails = page.locator('tr[data-queue="emails"]')
        assert emails.locator(".pgq-ready").inner_text() == "3"
        assert emails.locator(".pgq-dead").inner_text() == "2"
        assert page.locator('tr[data-queue="reports"] .pgq-state').inner_text() == "paused"
        assert page.locator("#pgq-workers").inner_text().count("web-1:4242") == 1
        page.screenshot(path=str(ARTIFACTS / "admin-dashboard.png"), full_page=True)

        # Dead letters of queue emails, then only those that timed out.
        emails.locator(".pgq-dead a").click()
        page.wait_for_selector("#result_list")
        assert page.locator("#result_list tbody tr").count() == 2
        page.locator('#changelist-filter a[href*="reason__exact=timeout"]').click()
        page.wait_for_selector("#result_list")
        assert page.locator("#result_list tbody tr").count() == 1
        assert "took 31 s" in page.locator("#result_list").inner_text()
        page.screenshot(path=str(ARTIFACTS / "admin-dead-filtered.png"), full_page=True)

        # Retry it with the change list action.
        page.check(f'input[name="_selected_action"][value="{timed_out.pk}"]')
        page.select_option('select[name="action"]', "retry_dead")
        page.click('button[name="index"]')
        page.wait_for_selector(".messagelist")
        assert "Retried 1 dead message." in page.locator(".messagelist").inner_text()
        assert page.locator("#result_list").count() == 0 or (
            page.locator(f'input[name="_selected_action"][value="{timed_out.pk}"]').count() == 0
        )

        # The message is live again under its own id; its payload is shown escaped.
        page.goto(f"{live_server.url}/admin/django_pgqueue/message/?q={timed_out.message_id}")
        assert page.locator("#result_list tbody tr").count() == 1
        page.goto(f"{live_server.url}/admin/django_pgqueue/message/{timed_out.message_id}/change/")
        assert HOSTILE in page.locator("pre.pgq-json").inner_text()
        assert page.locator("pre.pgq-json img").count() == 0

        # The Retry button on a dead message's own page.
        page.goto(f"{live_server.url}/admin/django_pgqueue/deadmessage/{errored.pk}/change/")
        assert "Traceback ..." in page.locator("pre.pgq-traceback").inner_text()
        page.screenshot(path=str(ARTIFACTS / "admin-dead-message.png"), full_page=True)
        page.click("button.pgq-retry")
        page.wait_for_url(f"**/admin/django_pgqueue/message/{errored.message_id}/change/")
        assert "Retried 1 dead message." in page.locator(".messagelist").inner_text()
        page.screenshot(path=str(ARTIFACTS / "admin-retried.png"), full_page=True)

    in_browser(steps)

    assert dialogs == []
    assert Message.objects.filter(pk__in=[timed_out.message_id, errored.message_id]).count() == 2
    assert Message.objects.get(pk=timed_out.message_id).attempts == 0
    assert not DeadMessage.objects.filter(pk__in=[timed_out.pk, errored.pk]).exists()
    assert DeadMessage.objects.count() == 1


def _failed_at(*minutes_ago: int) -> list[dict[str, Any]]:
    now = timezone.now()
    return [
        {
            "attempt": n,
            "at": (now - dt.timedelta(minutes=ago)).isoformat(),
            "worker": "web-1:4242",
            "type": "ConnectionError",
            "message": f"SMTP server refused the connection (attempt {n})",
        }
        for n, ago in enumerate(minutes_ago, start=1)
    ]


def test_numbers_a_user_can_trust_on_pages_that_fit(live_server: Any) -> None:
    """Table sizes before any ANALYZE, failed attempts that survive a retry, the real last
    error, one id column, times to the second, counts that are links, readable worker
    activity, and a dead list that fits beside its filters at 1,400 pixels."""
    now = timezone.now()
    MessageFactory.create_batch(3, queue="emails", available_at=now - dt.timedelta(minutes=2))
    MessageFactory(queue="emails", available_at=now + dt.timedelta(hours=1))
    ArchivedMessageFactory.create_batch(5, queue="emails")
    long_error = "SMTP server refused the connection: " + "421 too many connections " * 12
    dead = [
        DeadMessageFactory(
            queue="emails",
            task="emails.send_newsletter_to_every_subscriber_of_the_list",
            reason=reason,
            errors=_failed_at(90, 20, 1),
            details={"type": "ConnectionError", "message": long_error, "traceback": "Tb"},
        )
        for reason in (DeadReason.ERROR, DeadReason.LEASE_EXPIRED, DeadReason.TIMEOUT)
    ]
    WorkerHeartbeatFactory(
        worker_id="web-1:4242",
        hostname="web-1",
        queues=["reports", "emails"],
        stats={"rate": 2.5, "dead": 3, "in_flight": 1, "processed": 1234, "failed": 9},
    )
    operator = make_staff("numbers", *VIEW_PERMISSIONS, "retry_deadmessage")
    operator.set_password("a-long-test-password")
    operator.save()
    url = live_server.url

    def steps(page: Any) -> None:
        page.goto(f"{url}/admin/login/?next=/admin/django_pgqueue/queuestate/")
        page.fill("#id_username", "numbers")
        page.fill("#id_password", "a-long-test-password")
        page.click("input[type=submit]")
        page.wait_for_selector("#pgq-queues")
        emails = page.locator('tr[data-queue="emails"]')

        # Fresh tables, never analyzed: their sizes are counted, not estimated as 0.
        sizes = page.locator("#pgq-table-sizes").inner_text()
        assert "live 4," in sizes and "archive 5," in sizes and "dead 3 rows" in sizes, sizes
        # 3 dead messages failed 90, 20 and 1 minutes ago: 3 in 5 minutes, 6 in 60.
        assert emails.locator(".pgq-failed").inner_text() == "3 / 6"
        # Worker activity in reading order, its queues sorted.
        workers = page.locator("#pgq-workers").inner_text()
        order = ["processed", "failed", "dead", "in flight", "rate (msg/s)"]
        assert [workers.index(label) for label in order] == sorted(
            workers.index(label) for label in order
        )
        assert "1,234" in workers and "emails, reports" in workers and "{" not in workers
        page.screenshot(path=str(ARTIFACTS / "admin-dashboard-numbers.png"), full_page=True)

        # Ready is a link to exactly those messages.
        emails.locator(".pgq-ready a").click()
        page.wait_for_selector("#result_list")
        assert "state=ready" in page.url and "queue=emails" in page.url
        assert page.locator("#result_list tbody tr").count() == 3
        page.screenshot(path=str(ARTIFACTS / "admin-ready.png"), full_page=True)

        # The dead list at 1,400 px: one id column, seconds, one-line reason, nothing under
        # the filter sidebar and no sideways scrolling.
        page.goto(f"{url}/admin/django_pgqueue/deadmessage/?queue=emails")
        page.wait_for_selector("#result_list")
        headers = [
            h.strip().lower() for h in page.locator("#result_list thead th").all_inner_texts()
        ]
        assert [h for h in headers if "id" in h.split()] == ["message id"], headers
        died = page.locator("#result_list td.field-died_at_shown").first.inner_text()
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", died), died
        page.screenshot(path=str(ARTIFACTS / "admin-dead-list.png"), full_page=True)
        sidebar = page.locator("#changelist-filter").bounding_box()
        for cell in page.locator("#result_list tbody td").all():
            box = cell.bounding_box()
            assert box["x"] + box["width"] <= sidebar["x"] + 1, cell.inner_text()
        results = page.locator("#changelist .results")
        assert results.evaluate("e => e.scrollWidth <= e.clientWidth"), "the list scrolls sideways"
        for reason in page.locator(".pgq-reason").all():
            assert reason.evaluate("e => e.getClientRects().length") == 1, reason.inner_text()
        # Cut only where a title holds the whole: never the id, the reason or the time.
        for column in ("message_number", "reason_code", "died_at_shown"):
            for cell in page.locator(
                f"#result_list td.field-{column}, #result_list th.field-{column}"
            ).all():
                assert cell.evaluate("e => e.scrollWidth <= e.clientWidth"), cell.inner_text()
        task = page.locator("#result_list td.field-task_name span").first
        assert task.get_attribute("title") == dead[0].task
        error = page.locator(".pgq-error").first
        assert error.get_attribute("title").startswith("ConnectionError: SMTP server refused")
        assert error.evaluate("e => e.scrollWidth > e.clientWidth"), "cut, whole in its title"
        page.screenshot(path=str(ARTIFACTS / "admin-dead-list.png"), full_page=True)

        # Retry them all: the failures stay counted, and the live page shows the last error.
        page.check("#action-toggle")
        page.select_option('select[name="action"]', "retry_dead")
        page.click('button[name="index"]')
        page.wait_for_selector(".messagelist")
        assert "Retried 3 dead messages." in page.locator(".messagelist").inner_text()
        page.goto(f"{url}/admin/django_pgqueue/queuestate/")
        emails = page.locator('tr[data-queue="emails"]')
        assert emails.locator(".pgq-failed").inner_text() == "3 / 6"
        assert emails.locator(".pgq-dead").inner_text() == "0"
        page.goto(f"{url}/admin/django_pgqueue/message/{dead[0].message_id}/change/")
        last_error = page.locator(".field-last_error_pretty").inner_text()
        assert "SMTP server refused the connection (attempt 3)" in last_error, last_error
        page.screenshot(path=str(ARTIFACTS / "admin-retried-last-error.png"), full_page=True)

        # The workers list: queues as names, the detail's activity as a table in order.
        page.goto(f"{url}/admin/django_pgqueue/workerheartbeat/")
        assert "emails, reports" in page.locator("#result_list").inner_text()
        page.goto(f"{url}/admin/django_pgqueue/workerheartbeat/web-1:4242/change/")
        activity = page.locator("table.pgq-activity").inner_text()
        assert activity.index("processed") < activity.index("failed") < activity.index("rate")
        page.screenshot(path=str(ARTIFACTS / "admin-worker.png"), full_page=True)

    in_browser(steps)


def test_operator_reads_a_failed_batch_and_retries_its_failed_members(live_server: Any) -> None:
    from django_pgqueue import chain, enqueue_batch, step
    from django_pgqueue.models import Batch
    from tests.composition.helpers import bury, finish, where

    batch = enqueue_batch(
        [step("m", {"i": 1}), step("m", {"i": 2}), chain(step("a"), step("b"))],
        on_complete=step("done"),
        on_success=step("ok"),
        on_failure=step("ko"),
        label=f"nightly import {HOSTILE}",
    )
    good, bad, last = batch.member_ids
    [first] = Message.objects.filter(task="a").values_list("id", flat=True)
    finish(good)
    bury(bad)
    bury(first)
    operator = make_staff(
        "batcher", *VIEW_PERMISSIONS, "view_batch", "view_waitingmessage", "retry_deadmessage"
    )
    operator.set_password("a-long-test-password")
    operator.save()
    dialogs: list[str] = []

    def steps(page: Any) -> None:
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(f"{live_server.url}/admin/login/?next=/admin/django_pgqueue/batch/")
        page.fill("#id_username", "batcher")
        page.fill("#id_password", "a-long-test-password")
        page.click("input[type=submit]")
        page.wait_for_selector("#result_list")
        row = page.locator("#result_list tbody tr").first
        assert "1 / 2 / 3" in row.inner_text()
        assert row.locator(".field-state_code").inner_text() == "failed"
        page.screenshot(path=str(ARTIFACTS / "admin-batches.png"), full_page=True)

        row.locator("a").first.click()
        page.wait_for_selector(".pgq-failed-members")
        assert page.locator(".pgq-failed-members tbody tr, .pgq-failed-members tr").count() == 3
        assert "dependency_failed" in page.locator(".pgq-failed-members").inner_text()
        assert "dead: dependency_failed" in page.locator(".field-callbacks").inner_text()
        page.screenshot(path=str(ARTIFACTS / "admin-batch.png"), full_page=True)

        page.click("button.pgq-retry")
        page.wait_for_selector(".messagelist")
        assert "Retried 2 failed members of 1 batches" in page.locator(".messagelist").inner_text()
        assert "0 / 3" in page.locator(".field-progress").inner_text()

        # The chain's last step waits again for the retried first step: its page says so.
        page.goto(f"{live_server.url}/admin/django_pgqueue/waitingmessage/{last}/change/")
        assert f"#{first} (live)" in page.locator(".field-composition").inner_text()

    in_browser(steps)

    assert dialogs == []
    assert where(bad) == "live" and where(first) == "live" and where(last) == "waiting"
    assert Batch.objects.get(id=batch.id).failed == 0
