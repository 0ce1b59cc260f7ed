"""No stored value breaks an admin page: rows written by SQL with infinite or far-future
timestamps, huge counters, JSON Python cannot decode, and the wrong JSON types."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from tests.admin.conftest import StaffClient

pytestmark = pytest.mark.django_db

# JSON that PostgreSQL stores and Python cannot read: nested deeper than Python recurses,
# and an integer longer than Python converts from text.
DEEP = "(repeat('[', 5000) || repeat(']', 5000))::jsonb"
LONG_NUMBER = "('{\"n\": 1' || repeat('0', 5000) || '}')::jsonb"
TIMES = ["infinity", "-infinity", "275817-01-01 00:00:00+00", "4713-01-01 00:00:00+00 BC"]
BIG = 2_147_483_646


def _insert(sql: str, params: list[object] | None = None) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return [row[0] for row in cursor.fetchall()]


@pytest.fixture
def extreme_rows() -> dict[str, list[int]]:
    live = []
    for n, when in enumerate(TIMES):
        live += _insert(
            f"""INSERT INTO pgqueue_message (queue, task, payload, attempts, max_attempts,
                    available_at, enqueued_at, leased_at, lease_token, errors, last_error)
                VALUES ('extreme', 'odd.task', {DEEP if n % 2 else LONG_NUMBER}, %s, %s,
                        %s::timestamptz, %s::timestamptz, %s::timestamptz,
                        CASE WHEN %s THEN gen_random_uuid() END,
                        {LONG_NUMBER if n % 2 else "'\"not a list\"'"},
                        {DEEP if n % 2 else "'[1, 2]'"})
                RETURNING id""",
            [n, BIG + 1 - n % 2, when, TIMES[-1 - n], when, n % 2 == 1],
        )
    dead = _insert(
        f"""INSERT INTO pgqueue_dead (message_id, queue, task, payload, attempts, max_attempts,
                errors, enqueued_at, reason, details, died_at)
            VALUES (990001, 'extreme', 'odd.task', {DEEP}, %s, %s, {DEEP},
                    '-infinity', 'error', '"a string, not an object"', 'infinity'),
                   (990002, 'extreme', 'odd.task', {LONG_NUMBER}, 1, 1, '{{}}',
                    '275817-01-01', 'error', {LONG_NUMBER}, '4713-01-01 BC')
            RETURNING id""",
        [BIG, BIG + 1],
    )
    archived = _insert(
        f"""INSERT INTO pgqueue_archive (message_id, queue, task, payload, attempts,
                max_attempts, errors, enqueued_at, started_at, finished_at, result)
            VALUES (990003, 'extreme', 'odd.task', 'null', 0, 1, '[]', 'infinity',
                    '-infinity', 'infinity', {LONG_NUMBER}),
                   (990004, 'extreme', 'odd.task', {DEEP}, 0, 1, {DEEP},
                    '275817-01-01', '1999-01-01', '275817-01-01', {DEEP})
            RETURNING id"""
    )
    workers = _insert(
        f"""INSERT INTO pgqueue_worker (worker_id, hostname, pid, queues, concurrency,
                started_at, last_seen_at, stats)
            VALUES ('far-future', 'h', 1, '"extreme"', 2147483647, '-infinity', 'infinity',
                    {LONG_NUMBER}),
                   ('year-275817', 'h', 2, {DEEP}, 1, '4713-01-01 BC',
                    '275817-01-01', {DEEP})
            RETURNING worker_id"""
    )
    return {"message": live, "deadmessage": dead, "archivedmessage": archived, "workers": workers}


def _get(client: object, url: str) -> str:
    response = client.get(url)  # type: ignore[attr-defined]
    assert response.status_code == 200, url
    return str(response.content.decode())


def test_lists_and_detail_pages_show_what_python_cannot_hold(
    staff_client: StaffClient, extreme_rows: dict[str, list[int]]
) -> None:
    client = staff_client(superuser=True)
    for model in ("message", "deadmessage", "archivedmessage"):
        listing = _get(client, reverse(f"admin:django_pgqueue_{model}_changelist"))
        assert "infinity" in listing
        for pk in extreme_rows[model]:
            _get(client, reverse(f"admin:django_pgqueue_{model}_change", args=[pk]))
    # Every state filter and sorting by the timestamp column.
    live = reverse("admin:django_pgqueue_message_changelist")
    for state in ("ready", "scheduled", "in_flight", "retrying", "expired"):
        _get(client, f"{live}?state={state}")
    _get(client, f"{live}?o=7")
    page = _get(
        client, reverse("admin:django_pgqueue_message_change", args=[extreme_rows["message"][2]])
    )
    assert "275817-01-01 00:00:00+00" in page
    assert "Python cannot decode this JSON" in page

    _insert(
        "INSERT INTO pgqueue_queue (name, updated_at) VALUES ('extreme', 'infinity') RETURNING name"
    )
    _get(client, reverse("admin:django_pgqueue_queuestate_change", args=["extreme"]))

    workers = reverse("admin:django_pgqueue_workerheartbeat_changelist")
    assert "infinity" in _get(client, workers)
    for worker_id in extreme_rows["workers"]:
        _get(client, reverse("admin:django_pgqueue_workerheartbeat_change", args=[worker_id]))


def test_dashboard_and_purge_page_survive_them(
    staff_client: StaffClient, extreme_rows: dict[str, list[int]]
) -> None:
    client = staff_client("purge_queue")
    page = _get(client, reverse("admin:django_pgqueue_queuestate_changelist"))
    assert 'data-queue="extreme"' in page
    assert "over 100 years" in page  # the ready message available since -infinity
    assert "far-future" in page  # a heartbeat at 'infinity' is live for ever
    _get(client, reverse("admin:django_pgqueue_queue_purge") + "?queue=extreme")
