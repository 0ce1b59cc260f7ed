"""A real headless Chromium, driven by Playwright, against the example project's admin on a
live server: log in, read the dashboard, filter the dead letters, retry, see them live.

Screenshots go to ``test-artifacts/`` (git-ignored); docs/img/admin-dashboard.png is one.
"""

from __future__ import annotations

import datetime as dt
import os
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
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
HOSTILE = "<img src=x onerror=alert(1)>"


def in_browser(steps: Callable[[Any], None]) -> None:
    """Run ``steps(page)`` in a headless Chromium on a helper thread.

    Playwright's sync API keeps an asyncio loop running in its thread; Django's ORM refuses
    to run there, so the test thread keeps the database and the helper keeps the browser.
    """
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/system-deps.sh (installs chromium)")
    ARTIFACTS.mkdir(exist_ok=True)

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
