"""The queue gauges (``django_pgqueue.metrics``): the database state, read without COUNT(*)
scans, and served by the Django view a project mounts."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pytest
from django.test import Client

import django_pgqueue
from django_pgqueue.metrics.queues import read_gauges
from django_pgqueue.models import Message, QueueState, WorkerHeartbeat

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


def fill() -> None:
    """Queue ``a``: 3 ready, 2 scheduled, 2 leased, 1 cancelled (dead); ``b``: 1 ready."""
    for i in range(5):
        django_pgqueue.enqueue("tests.echo", i, queue="a")
    for i in range(2):
        django_pgqueue.enqueue("tests.echo", i, queue="a", run_after=dt.timedelta(hours=1))
    doomed = django_pgqueue.enqueue("tests.echo", "doomed", queue="a", priority=5)
    assert django_pgqueue.cancel(doomed.id) == "cancelled"
    leased = Message.objects.lease("a", worker_id="test", batch_size=2, visibility_timeout=60)
    assert len(leased) == 2
    django_pgqueue.enqueue("tests.echo", "b", queue="b", priority=3)
    QueueState.objects.create(name="b", paused=True)


def test_gauges_match_the_database() -> None:
    fill()
    snapshot = read_gauges()
    by_name = {q.name: q for q in snapshot.queues}
    a, b = by_name["a"], by_name["b"]
    assert (a.ready.value, a.scheduled.value, a.in_flight.value, a.dead.value) == (3, 2, 2, 1)
    assert (b.ready.value, b.scheduled.value, b.in_flight.value, b.dead.value) == (1, 0, 0, 0)
    assert not any(c.capped for c in (a.ready, a.scheduled, a.in_flight, a.dead))
    assert a.oldest_ready_seconds >= 0 and not a.paused and b.paused


def test_counts_stop_at_the_cap_and_say_so() -> None:
    for i in range(5):
        django_pgqueue.enqueue("tests.echo", i, queue="a")
    ready = read_gauges(cap=3).queues[0].ready
    assert (ready.value, ready.capped) == (3, True)


def test_an_empty_database_has_no_queue_series() -> None:
    snapshot = read_gauges()
    assert snapshot.queues == [] and snapshot.live_workers == 0


@pytest.mark.urls("tests.metrics.urls")
def test_the_view_serves_the_gauges(client: Client) -> None:
    fill()
    WorkerHeartbeat.objects.create(worker_id="w1", hostname="h", pid=1, concurrency=1)
    response = client.get("/metrics/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }

    def gauge(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    for state, value in {"ready": 3, "scheduled": 2, "in_flight": 2, "dead": 1}.items():
        assert gauge("pgqueue_queue_messages", queue="a", state=state) == value
        assert gauge("pgqueue_queue_messages_capped", queue="a", state=state) == 0
    assert gauge("pgqueue_queue_messages", queue="b", state="ready") == 1
    assert gauge("pgqueue_queue_paused", queue="b") == 1
    assert gauge("pgqueue_queue_oldest_ready_age_seconds", queue="a") >= 0
    assert gauge("pgqueue_workers_live") == 1
    assert gauge("pgqueue_metrics_count_cap") == 10_000


@pytest.mark.urls("tests.metrics.urls")
def test_the_view_answers_get_only(client: Client) -> None:
    assert client.post("/metrics/").status_code == 405


def test_the_view_needs_no_admin_app() -> None:
    """A project without django.contrib.admin can mount the view."""
    code = (
        "import sys, django; from django.conf import settings; "
        "settings.configure(INSTALLED_APPS=['django_pgqueue']); django.setup(); "
        "import django_pgqueue.metrics.urls; "
        "assert 'django_pgqueue.admin' not in sys.modules, 'the admin was imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
