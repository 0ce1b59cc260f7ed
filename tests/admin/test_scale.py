"""The admin at scale. The dashboard at 1,000,000 live rows: the statement count stays that
of an empty queue. Searches and failure counts: no plan reads a big table row by row.

Times are printed and written to ``test-artifacts/admin-dashboard-scale.md`` beside a plain
``COUNT(*) ... GROUP BY`` reference measured in the same run; only the statement count and
the capping are asserted (times belong to benchmarks, not tests).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgqueue.admin.overview import COUNT_CAP, CappedCount, read_overview
from tests.admin.conftest import VIEW_PERMISSIONS, make_staff

pytestmark = [pytest.mark.slow, pytest.mark.scale, pytest.mark.django_db(transaction=True)]

LIVE_ROWS = 1_000_000
ARCHIVED_ROWS = 200_000
DEAD_ROWS = 100_000
ARTIFACT = Path(__file__).resolve().parents[2] / "test-artifacts" / "admin-dashboard-scale.md"

# Four queues; 60 % ready, 35 % scheduled or backing off, 5 % leased; three priorities.
LOAD_LIVE = """
INSERT INTO pgqueue_message (queue, task, payload, priority, attempts, max_attempts,
                             available_at, lease_token, leased_by, leased_at, enqueued_at)
SELECT 'q' || (i %% 4), 'bench.task', jsonb_build_object('n', i), (i %% 3) - 1,
       CASE WHEN i %% 20 = 0 OR i %% 7 = 0 THEN 1 ELSE 0 END, 3,
       CASE WHEN i %% 20 = 0 THEN now() + interval '30 seconds'
            WHEN i %% 100 < 60 THEN now() - make_interval(secs => i %% 3600)
            ELSE now() + make_interval(secs => i %% 86400 + 1) END,
       CASE WHEN i %% 20 = 0 THEN gen_random_uuid() END,
       CASE WHEN i %% 20 = 0 THEN 'bench-worker' END,
       CASE WHEN i %% 20 = 0 THEN now() END,
       now() - interval '1 hour'
FROM generate_series(1, %s) AS i
"""
LOAD_ARCHIVE = """
INSERT INTO pgqueue_archive (message_id, queue, task, payload, priority, attempts,
                             max_attempts, errors, enqueued_at, started_at, finished_at)
SELECT 10000000 + i, 'q' || (i %% 4), 'bench.task', '{}'::jsonb, 0, 1, 3, '[]'::jsonb,
       now() - interval '2 hours', now() - make_interval(secs => i %% 3000 + 1),
       now() - make_interval(secs => i %% 3000)
FROM generate_series(1, %s) AS i
"""
LOAD_DEAD = """
INSERT INTO pgqueue_dead (message_id, queue, task, payload, priority, attempts, max_attempts,
                          errors, enqueued_at, reason, details, died_at)
SELECT 20000000 + i, 'q' || (i %% 4), 'bench.task', '{}'::jsonb, 0, 3, 3, '[]'::jsonb,
       now() - interval '3 hours', 'error', '{"type": "ValueError"}'::jsonb,
       now() - make_interval(secs => i %% 86400)
FROM generate_series(1, %s) AS i
"""
REFERENCE = """
SELECT queue, count(*) FILTER (WHERE available_at <= now()),
       count(*) FILTER (WHERE available_at > now() AND lease_token IS NULL),
       count(*) FILTER (WHERE available_at > now() AND lease_token IS NOT NULL)
FROM pgqueue_message GROUP BY queue
"""


def _timed(func):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = func()
    return result, (time.perf_counter() - start) * 1000


def test_dashboard_at_a_million_rows() -> None:
    with connection.cursor() as cursor:
        cursor.execute(LOAD_LIVE, [LIVE_ROWS])
        cursor.execute(LOAD_ARCHIVE, [ARCHIVED_ROWS])
        cursor.execute(LOAD_DEAD, [DEAD_ROWS])
        for table in ("pgqueue_message", "pgqueue_archive", "pgqueue_dead"):
            cursor.execute(f"VACUUM ANALYZE {table}")

    read_overview()  # warm the cache the way a second page view would find it
    with CaptureQueriesContext(connection) as overview_queries:
        overview, overview_ms = _timed(read_overview)
    assert len(overview_queries) <= 7  # five statements, BEGIN, COMMIT
    by_name = {q.name: q for q in overview.queues}
    assert sorted(by_name) == ["q0", "q1", "q2", "q3"]
    for queue in by_name.values():
        assert queue.ready.capped and queue.ready.value == COUNT_CAP
        assert queue.dead.capped
        assert queue.processed_60m.value == ARCHIVED_ROWS // 4
        assert queue.oldest_ready_age is not None
    assert overview.estimated_rows["pgqueue_message"] > LIVE_ROWS * 0.9

    client = Client()
    client.force_login(make_staff("scale", *VIEW_PERMISSIONS))
    client.get(reverse("admin:django_pgqueue_queuestate_changelist"))
    with CaptureQueriesContext(connection) as page_queries:
        response, page_ms = _timed(
            lambda: client.get(reverse("admin:django_pgqueue_queuestate_changelist"))
        )
    assert response.status_code == 200
    assert len(page_queries) <= 12  # session, user, permissions, then the overview

    pages = {}
    for model in ("message", "deadmessage", "archivedmessage"):
        url = reverse(f"admin:django_pgqueue_{model}_changelist")
        with CaptureQueriesContext(connection) as list_queries:
            listing, pages[model] = _timed(lambda url=url: client.get(url))
        assert listing.status_code == 200
        assert listing.context["cl"].result_count == COUNT_CAP
        assert len(list_queries) <= 12

    with connection.cursor() as cursor:
        _, reference_ms = _timed(lambda: cursor.execute(REFERENCE) or cursor.fetchall())

    report = "\n".join(
        [
            f"Dashboard at {LIVE_ROWS:,} live, {ARCHIVED_ROWS:,} archived and "
            f"{DEAD_ROWS:,} dead rows (4 queues, 3 priorities), one run:",
            "",
            "| what | statements | ms |",
            "|---|---:|---:|",
            f"| read_overview() | {len(overview_queries)} | {overview_ms:.1f} |",
            f"| dashboard page (with session and user) | {len(page_queries)} | {page_ms:.1f} |",
            f"| live messages list | | {pages['message']:.1f} |",
            f"| dead messages list | | {pages['deadmessage']:.1f} |",
            f"| archived messages list | | {pages['archivedmessage']:.1f} |",
            f"| reference: exact COUNT(*) GROUP BY of the live table | 1 | {reference_ms:.1f} |",
            "",
            f"read_overview() took {overview_ms / reference_ms:.2f}x the reference's time.",
        ]
    )
    print("\n" + report)
    ARTIFACT.parent.mkdir(exist_ok=True)
    ARTIFACT.write_text(report + "\n")


SEARCH_LIVE_ROWS = 200_000
SEARCH_ARCHIVED_ROWS = 200_000
SEARCH_DEAD_ROWS = 50_000
# Some rows of each table carry a dedup key, tenant and worker id, and every failed attempt
# leaves an errors entry, as real rows do.
LOAD_SEARCHABLE = [
    """INSERT INTO pgqueue_message (queue, task, payload, tenant, dedup_key, errors)
       SELECT 'q' || (i %% 4), 'task.' || (i %% 50), '{}'::jsonb, 'tenant-' || (i %% 1000),
              CASE WHEN i %% 10 = 0 THEN 'key-' || i END,
              CASE WHEN i %% 499 = 0 THEN jsonb_build_array(jsonb_build_object(
                  'attempt', 1, 'at', now() - interval '1 minute')) ELSE '[]'::jsonb END
       FROM generate_series(1, %s) AS i""",
    """INSERT INTO pgqueue_archive (message_id, queue, task, payload, tenant, dedup_key,
                                    worker_id, errors, finished_at)
       SELECT 30000000 + i, 'q' || (i %% 4), 'task.' || (i %% 50), '{}'::jsonb,
              'tenant-' || (i %% 1000), 'key-' || i, 'worker-' || (i %% 8),
              CASE WHEN i %% 499 = 0 THEN jsonb_build_array(jsonb_build_object(
                  'attempt', 1, 'at', now() - interval '1 minute')) ELSE '[]'::jsonb END,
              now() - make_interval(secs => i %% 3000)
       FROM generate_series(1, %s) AS i""",
    """INSERT INTO pgqueue_dead (message_id, queue, task, payload, tenant, dedup_key,
                                 worker_id, errors, reason, details, died_at)
       SELECT 40000000 + i, 'q' || (i %% 4), 'task.' || (i %% 50), '{}'::jsonb,
              'tenant-' || (i %% 1000), 'key-' || i, 'worker-' || (i %% 8),
              jsonb_build_array(jsonb_build_object(
                  'attempt', 3, 'at', now() - make_interval(secs => i %% 86400))), 'error',
              '{}'::jsonb, now() - make_interval(secs => i %% 86400)
       FROM generate_series(1, %s) AS i""",
]


BIG_TABLES = ("pgqueue_message", "pgqueue_archive", "pgqueue_dead")
# Every errors entry of every row, the slow way.
FAILED_REFERENCE = """
SELECT queue, count(*) FILTER (WHERE (e->>'at')::timestamptz >= now() - interval '5 minutes'),
       count(*) FILTER (WHERE (e->>'at')::timestamptz >= now() - interval '60 minutes')
FROM (SELECT queue, errors FROM pgqueue_message UNION ALL SELECT queue, errors
      FROM pgqueue_archive UNION ALL SELECT queue, errors FROM pgqueue_dead) r,
     jsonb_array_elements(r.errors) e
GROUP BY queue
"""


def _plan_nodes(plan: dict) -> list[dict]:  # type: ignore[type-arg]
    return [plan, *(node for child in plan.get("Plans", []) for node in _plan_nodes(child))]


def _scans_a_table(sql: str, tables: tuple[str, ...] = BIG_TABLES) -> list[str]:
    """What of ``sql``'s executed plan reads a queue table row by row: sequential scans, and
    filters that threw away more than a page of rows."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        (plan,) = cursor.fetchone()[0]
    found = []
    for node in _plan_nodes(plan["Plan"]):
        relation = node.get("Relation Name", "")
        if relation not in tables:
            continue
        removed = node.get("Rows Removed by Filter", 0) * node.get("Actual Loops", 1)
        if node["Node Type"] == "Seq Scan" or removed > 1_000:
            found.append(f"{node['Node Type']} on {relation} (removed {removed})")
    return found


def test_searches_and_failure_counts_read_indexes_only() -> None:
    """Admin search takes only what an index serves (message ids, live dedup keys), so no
    term, found or not, makes a change list scan a big table; the dashboard's failed
    attempts walk the partial indexes of rows with errors. Checked on the executed plans."""
    with connection.cursor() as cursor:
        for statement, rows in zip(
            LOAD_SEARCHABLE,
            [SEARCH_LIVE_ROWS, SEARCH_ARCHIVED_ROWS, SEARCH_DEAD_ROWS],
            strict=True,
        ):
            cursor.execute(statement, [rows])
        for table in ("pgqueue_message", "pgqueue_archive", "pgqueue_dead"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    client = Client()
    client.force_login(make_staff("search", *VIEW_PERMISSIONS))
    terms = ["task.7", "tenant-7", "worker-3", "key-70", "30000070", "40000070", "no-such"]

    report = ["| list | search | rows | plan reads a table row by row |", "|---|---|---:|---|"]
    for model in ("message", "archivedmessage", "deadmessage"):
        url = reverse(f"admin:django_pgqueue_{model}_changelist")
        for term in terms:
            with CaptureQueriesContext(connection) as queries:
                page = client.get(url, {"q": term})
            assert page.status_code == 200
            scans = [
                scan
                for query in queries.captured_queries
                if query["sql"].lstrip().upper().startswith(("SELECT", "WITH"))
                and "pgqueue_" in query["sql"]
                for scan in _scans_a_table(query["sql"])
            ]
            report.append(f"| {model} | {term} | {page.context['cl'].result_count} | {scans} |")
            assert scans == [], (model, term, scans)
        # What the indexes serve is still found.
    assert _found(client, "message", "key-70") == 1
    assert _found(client, "archivedmessage", "30000070") == 1
    assert _found(client, "deadmessage", "40000070") == 1

    # One transaction: both see the same now(), so no error ages out between them.
    with transaction.atomic(), CaptureQueriesContext(connection) as overview_queries:
        overview = read_overview()
        with connection.cursor() as cursor:
            cursor.execute(FAILED_REFERENCE)
            reference = {queue: (CappedCount(n5), CappedCount(n60)) for queue, n5, n60 in cursor}
    assert {q.name: (q.failed_5m, q.failed_60m) for q in overview.queues} == reference
    stats = next(q["sql"] for q in overview_queries.captured_queries if "failed5" in q["sql"])
    assert _scans_a_table(stats) == []
    print("\n" + "\n".join(report))


def _found(client: Client, model: str, term: str) -> int:
    page = client.get(reverse(f"admin:django_pgqueue_{model}_changelist"), {"q": term})
    return int(page.context["cl"].result_count)


# Composition at scale: one batch of 200,000 members (10 dead), 100,000 completed batches,
# 1,000 open ones whose completion callbacks wait, 20,000 messages waiting on dependencies,
# beside 200,000 live and 100,000 dead messages of no batch.
BIG_BATCH_MEMBERS = 200_000
LOAD_COMPOSITION = [
    LOAD_LIVE % BIG_BATCH_MEMBERS,
    LOAD_ARCHIVE % BIG_BATCH_MEMBERS,
    LOAD_DEAD % DEAD_ROWS,
    """INSERT INTO pgqueue_dead (message_id, queue, task, payload, priority, attempts,
                                 max_attempts, errors, enqueued_at, reason, details, died_at)
       SELECT 50000000 + i, 'q0', 'member.task', '{}'::jsonb, 0, 3, 3, '[]'::jsonb, now(),
              'error', '{"type": "ValueError", "message": "boom"}'::jsonb, now()
       FROM generate_series(1, 10) AS i""",
    """INSERT INTO pgqueue_batch (id, label, total, succeeded, failed, created_at, completed_at)
       VALUES (1, 'big', 200010, 200000, 10, now() - interval '1 hour', now())""",
    """INSERT INTO pgqueue_batch_member (message_id, batch_id)
       SELECT 10000000 + i, 1 FROM generate_series(1, 200000) AS i
       UNION ALL SELECT 50000000 + i, 1 FROM generate_series(1, 10) AS i""",
    """INSERT INTO pgqueue_batch (id, label, total, succeeded, failed, created_at, completed_at,
                                  succeeded_at)
       SELECT 100 + i, 'done ' || i, 10, 10, 0, now() - make_interval(secs => i),
              now() - make_interval(secs => i), now() - make_interval(secs => i)
       FROM generate_series(1, 100000) AS i""",
    """INSERT INTO pgqueue_waiting (id, queue, task, priority, max_attempts, pending, delay,
                                    fair, enqueued_at)
       SELECT 60000000 + i, 'q' || (i %% 4), 'waiting.task', 0, 3,
              CASE WHEN i <= 1000 THEN 1 ELSE 2 END, 0, false, now()
       FROM generate_series(1, 21000) AS i""",
    """INSERT INTO pgqueue_dependency (prerequisite_id, dependent_id)
       SELECT 10000000 + (i %% 1000) * 2 + k, 60000000 + i
       FROM generate_series(1001, 21000) AS i, generate_series(1, 2) AS k""",
    """INSERT INTO pgqueue_batch (id, label, total, succeeded, failed, created_at, on_complete_id)
       SELECT 200000 + i, 'open ' || i, 10, 5, 0, now() - make_interval(secs => i), 60000000 + i
       FROM generate_series(1, 1000) AS i""",
]
COMPOSITION_TABLES = (
    *BIG_TABLES,
    "pgqueue_waiting",
    "pgqueue_dependency",
    "pgqueue_batch_member",
)


def test_batch_and_waiting_pages_at_scale() -> None:
    """The batch list and page, the waiting list and page, and a dead member's page read no
    composition table row by row (the batches table itself excepted: finding the batch whose
    callback a message is has no index, see the report). Checked on the executed plans."""
    with connection.cursor() as cursor:
        for statement in LOAD_COMPOSITION:
            cursor.execute(statement.replace("%%", "%"))
        for table in (*COMPOSITION_TABLES, "pgqueue_batch"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    client = Client()
    client.force_login(
        make_staff("batches", *VIEW_PERMISSIONS, "view_batch", "view_waitingmessage")
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM pgqueue_dead WHERE message_id = 50000001")
        (dead_member,) = cursor.fetchone()
        cursor.execute("SELECT min(id) FROM pgqueue_message")
        (live,) = cursor.fetchone()
    pages = {
        "batch list": reverse("admin:django_pgqueue_batch_changelist"),
        "open batches": reverse("admin:django_pgqueue_batch_changelist") + "?state=running",
        "big batch": reverse("admin:django_pgqueue_batch_change", args=[1]),
        "waiting list": reverse("admin:django_pgqueue_waitingmessage_changelist"),
        "waiting message": reverse("admin:django_pgqueue_waitingmessage_change", args=[60005000]),
        "dead member": reverse("admin:django_pgqueue_deadmessage_change", args=[dead_member]),
        "live message of no batch": reverse("admin:django_pgqueue_message_change", args=[live]),
    }
    report = ["| page | statements | ms | rows read row by row |", "|---|---:|---:|---|"]
    for name, url in pages.items():
        client.get(url)
        with CaptureQueriesContext(connection) as queries:
            page, ms = _timed(lambda url=url: client.get(url))
        assert page.status_code == 200, name
        scans = [
            scan
            for query in queries.captured_queries
            if query["sql"].lstrip().upper().startswith(("SELECT", "WITH"))
            and "pgqueue_" in query["sql"]
            for scan in _scans_a_table(query["sql"], COMPOSITION_TABLES)
        ]
        report.append(f"| {name} | {len(queries)} | {ms:.1f} | {scans} |")
        assert scans == [], (name, scans)
        assert len(queries) <= 30, name
    print("\n" + "\n".join(report))
