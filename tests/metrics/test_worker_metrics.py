"""``pgq_worker --metrics-port``: a real worker process's counters, histograms and state,
scraped after it processed messages, checked against the database."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

import django_pgqueue
from django_pgqueue.models import ArchivedMessage, DeadMessage
from tests.acceptance.conftest import REPO, WorkerProcess, spawn_worker  # noqa: F401 (fixture)
from tests.worker.conftest import wait_for
from tests.worker.http_probe import endpoint_port, get, probe, run_pgq_worker

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
Spawn = Callable[..., WorkerProcess]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = get(port, "/metrics")
    assert status == 200, text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_worker_counts_what_it_did_by_task(spawn_worker: Spawn) -> None:  # noqa: F811
    # One port for both flags: one server answers /metrics and the probes.
    worker = spawn_worker(
        "--metrics-port", "0", "--health-port", "0", "--queue", "m", "--concurrency", "2"
    ).ready()
    port = endpoint_port(worker, "/metrics")
    assert probe(port, "/readyz")[0] == 200
    ok = [django_pgqueue.enqueue("tests.echo", i, queue="m") for i in range(5)]
    bad = [django_pgqueue.enqueue("tests.fail", i, queue="m", max_attempts=2) for i in range(3)]
    wait_for(lambda: ArchivedMessage.objects.count() == len(ok), timeout=30)
    wait_for(lambda: DeadMessage.objects.count() == len(bad), timeout=30)
    samples = wait_for(
        lambda: (
            (s := scrape(port)).get(
                (
                    "pgqueue_worker_messages_dead_total",
                    (("queue", "m"), ("reason", "error"), ("task", "tests.fail")),
                )
            )
            == 3
            and s
        )
    )

    def value(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    echo = {"queue": "m", "task": "tests.echo"}
    fail = {"queue": "m", "task": "tests.fail"}
    assert value("pgqueue_worker_messages_processed_total", **echo) == 5
    assert value("pgqueue_worker_messages_processed_total", **fail) == 0
    assert value("pgqueue_worker_messages_failed_total", **fail) == 6  # two attempts each
    assert value("pgqueue_worker_messages_retried_total", **fail) == 3
    # Every handler run is in the histogram: 5 successes and 6 failed attempts.
    assert value("pgqueue_worker_handler_duration_seconds_count", **echo) == 5
    assert value("pgqueue_worker_handler_duration_seconds_count", **fail) == 6
    assert value("pgqueue_worker_handler_duration_seconds_bucket", le="+Inf", **echo) == 5
    assert value("pgqueue_worker_handler_duration_seconds_sum", **echo) > 0
    # Claims: every message run was leased by one of them (5 + 3 first runs + 3 retries).
    assert value("pgqueue_worker_claim_batch_size_sum", queue="m") == 11
    assert value("pgqueue_worker_claim_batch_size_count", queue="m") >= 1
    assert value("pgqueue_worker_listener_reconnects_total") == 0
    assert value("pgqueue_worker_in_flight") == 0
    assert value("pgqueue_worker_concurrency") == 2
    assert value("pgqueue_worker_draining") == 0
    assert value("pgqueue_worker_info", worker_id=worker.worker_id, hostname=_hostname()) == 1
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_unregistered_task_names_share_one_label_value(spawn_worker: Spawn) -> None:  # noqa: F811
    # Whoever enqueues chooses task names: each unknown one must not become its own series.
    worker = spawn_worker("--metrics-port", "0", "--queue", "u").ready()
    port = endpoint_port(worker, "/metrics")
    django_pgqueue.enqueue_many("tests.echo", [1, 2], queue="u")
    for i in range(200):
        django_pgqueue.enqueue(f"nobody.registered-{i}", {}, queue="u")
    wait_for(lambda: DeadMessage.objects.count() == 200, timeout=30)
    wait_for(lambda: ArchivedMessage.objects.count() == 2, timeout=30)
    dead_series = "pgqueue_worker_messages_dead_total"
    samples = wait_for(
        lambda: (
            (s := scrape(port)).get(
                (dead_series, (("queue", "u"), ("reason", "rejected"), ("task", "(unregistered)")))
            )
            == 200
            and s
        )
    )
    tasks = {dict(labels).get("task") for _, labels in samples}
    assert tasks == {None, "(unregistered)", "tests.echo"}, sorted(map(str, tasks))
    failed = [key for key in samples if key[0] == "pgqueue_worker_messages_failed_total"]
    assert failed == [
        ("pgqueue_worker_messages_failed_total", (("queue", "u"), ("task", "(unregistered)")))
    ]
    assert len(samples) < 100  # every series of this worker, whatever the senders named
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_a_killed_listen_connection_is_counted(
    spawn_worker: Spawn,  # noqa: F811
    admin_conn: object,
) -> None:
    from tests.acceptance.conftest import terminate_backends

    worker = spawn_worker("--metrics-port", "0").ready()
    port = endpoint_port(worker, "/metrics")
    assert terminate_backends(admin_conn, worker.worker_id, "listener") == 1
    wait_for(lambda: scrape(port)[("pgqueue_worker_listener_reconnects_total", ())] == 1)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def _hostname() -> str:
    import socket

    return socket.gethostname()


def test_metrics_without_prometheus_client_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "prometheus_client"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('not installed (test)')\n")
    result = run_pgq_worker("--metrics-port", "0", path_first=str(tmp_path))
    assert result.returncode == 1
    assert 'pip install "django-pgqueue-mq[metrics]"' in result.stderr, result.stderr
