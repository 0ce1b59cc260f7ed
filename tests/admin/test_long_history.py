"""A message with a huge error history (written before the history was bounded, or by SQL)
renders a small page: the first and last attempts, and how many are between (issue #58)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from django_pgqueue.admin.display import errors_html
from tests.admin.conftest import StaffClient

pytestmark = pytest.mark.django_db

ATTEMPTS = 3_000


def insert_dead_with_history(message_id: int, attempts: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO pgqueue_dead (message_id, queue, task, payload, attempts,
                   max_attempts, errors, enqueued_at, reason, details, died_at)
               SELECT %s, 'q', 'flaky.task', '{}', %s, %s,
                      jsonb_agg(jsonb_build_object(
                          'attempt', i, 'at', now(), 'worker', 'w1', 'type', 'ValueError',
                          'message', 'failure ' || i || ' ' || repeat('m', 3000),
                          'traceback', 'Traceback ' || i || ' ' || repeat('x', 10000))
                          ORDER BY i),
                      now(), 'error', '{"type": "ValueError", "message": "last"}', now()
               FROM generate_series(1, %s) AS i
               RETURNING id""",
            [message_id, attempts, attempts, attempts],
        )
        return int(cursor.fetchone()[0])


def test_the_page_of_a_dead_message_with_thousands_of_attempts_stays_small(
    staff_client: StaffClient,
) -> None:
    pk = insert_dead_with_history(990_500, ATTEMPTS)
    page = staff_client().get(reverse("admin:django_pgqueue_deadmessage_change", args=[pk]))

    assert page.status_code == 200
    html = page.content.decode()
    assert len(html) < 400_000  # the history stored is ~40 MB
    assert "<strong>attempt 1</strong>" in html and f"<strong>attempt {ATTEMPTS}</strong>" in html
    assert "<strong>attempt 11</strong>" not in html
    assert f"{ATTEMPTS - 20:,} attempts between these are not shown" in html


def test_a_bounded_history_shows_its_count_of_dropped_attempts() -> None:
    kept = [{"attempt": n, "type": "E", "message": "m"} for n in (1, 2)]
    html = errors_html([kept[0], {"omitted": 41}, kept[1]])
    assert html.count("<li>") == 3
    assert "41 attempts between these are not shown" in html


def test_each_attempts_traceback_is_cut_on_the_page() -> None:
    html = errors_html([{"attempt": 1, "type": "E", "message": "m", "traceback": "x" * 50_000}])
    assert len(html) < 10_000 and "more characters" in html
