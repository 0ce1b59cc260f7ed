"""Waiting messages cost the claim nothing: it never reads the table they wait in."""

from __future__ import annotations

import json

import pytest
from django.db import connection, transaction

import django_pgqueue
from django_pgqueue.models import Message

from ..plans import buffers, nested_plans, unbounded_reads

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
@pytest.mark.scale
def test_a_claim_reads_only_claimable_entries_with_a_million_messages_waiting() -> None:
    blocker = django_pgqueue.enqueue("t", {}, queue="blocker")
    ready = [django_pgqueue.enqueue("t", {"n": n}).id for n in range(10)]
    # A million messages of the same queue waiting on one that has not run, as enqueue with
    # after= would have written them.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_waiting (id, queue, task, payload, priority, max_attempts,"
            "    pending, delay, fair) "
            "SELECT nextval(pg_get_serial_sequence('pgqueue_message', 'id')), 'default', 't',"
            "       '{}'::jsonb, 100, 3, 1, 0, false "
            "FROM generate_series(1, 1000000)"
        )
        cursor.execute(
            "INSERT INTO pgqueue_dependency (prerequisite_id, dependent_id) "
            "SELECT %s, id FROM pgqueue_waiting",
            [blocker.id],
        )
        cursor.execute("ANALYZE pgqueue_waiting")
        cursor.execute("ANALYZE pgqueue_dependency")
    with transaction.atomic():
        with nested_plans(connection) as plans:
            leased = Message.objects.lease("default", worker_id="w1", batch_size=10, hold=True)
        transaction.set_rollback(True)
    assert sorted(m.id for m in leased) == ready
    assert plans
    for plan in plans:
        text = json.dumps(plan)
        assert "pgqueue_waiting" not in text and "pgqueue_dependency" not in text
        assert unbounded_reads([plan]) == [], plan["Query Text"]
        # The ten claimed rows and their index entries: a few dozen buffers, not the
        # million waiting rows' thousands of pages.
        assert buffers(plan) < 200, plan["Query Text"]
