"""Claims on a connection with psycopg's server-side binding (one statement per query)."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import override_settings

import django_pgqueue
from django_pgqueue.models import Message

# tests/settings.py: the test database again, with OPTIONS["server_side_binding"].
ALIAS = "server_side_binding"
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", ALIAS])


def lease(hold: bool) -> list[Message]:
    if not hold:
        return Message.objects.lease("lim", worker_id="w", batch_size=2, using=ALIAS)
    with transaction.atomic(using=ALIAS):
        return Message.objects.lease("lim", worker_id="w", batch_size=2, hold=True, using=ALIAS)


@pytest.mark.parametrize("hold", [False, True], ids=["own-transaction", "hold"])
@pytest.mark.parametrize(
    "queue_settings",
    [
        {},
        {"CONCURRENCY_LIMIT": 2},
        {"RATE_LIMIT": 100.0},
        {"KEY_CONCURRENCY_LIMIT": 1},
        {"FAIRNESS": True},
    ],
    ids=["plain", "concurrency", "rate", "key-concurrency", "fair"],
)
def test_a_lease_works_with_server_side_binding(queue_settings, hold):
    with override_settings(PGQUEUE={"BACKOFF_JITTER": 0.0, "QUEUES": {"lim": queue_settings}}):
        for n in range(3):
            django_pgqueue.enqueue("t", {"n": n}, queue="lim", tenant=f"k{n}", using=ALIAS)
        leased = lease(hold)
        assert sorted(m.payload["n"] for m in leased) == [0, 1]
        assert Message.objects.filter(lease_token__isnull=False).count() == 2
