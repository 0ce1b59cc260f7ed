"""``manage.py pgq_status``: capped counts per queue, dead by reason, workers, thresholds."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from django_pgqueue.management.commands.pgq_status import THRESHOLD_EXIT_CODE
from django_pgqueue.models import DeadReason
from tests.acceptance.conftest import REPO, database_url
from tests.factories import (
    DeadMessageFactory,
    MessageFactory,
    QueueStateFactory,
    WorkerHeartbeatFactory,
)

pytestmark = pytest.mark.django_db


def status(*args: str) -> str:
    out = StringIO()
    call_command("pgq_status", *args, stdout=out)
    return out.getvalue()


def make_backlog() -> None:
    now = timezone.now()
    MessageFactory.create_batch(3, queue="emails", available_at=now - dt.timedelta(minutes=10))
    MessageFactory(queue="emails", available_at=now + dt.timedelta(hours=1))
    MessageFactory(queue="emails", leased=True)
    DeadMessageFactory.create_batch(2, queue="emails", reason=DeadReason.ERROR)
    DeadMessageFactory(queue="emails", reason=DeadReason.CANCELLED)
    QueueStateFactory(name="reports", paused=True)


def test_json_has_each_queues_counts_dead_by_reason_and_the_workers() -> None:
    make_backlog()
    WorkerHeartbeatFactory(worker_id="w-alive")
    report = json.loads(status("--json"))
    emails = next(q for q in report["queues"] if q["name"] == "emails")
    assert emails["ready"] == {"value": 3, "capped": False}
    assert emails["scheduled"]["value"] == 1 and emails["in_flight"]["value"] == 1
    assert emails["dead"]["value"] == 3
    assert emails["dead_by_reason"] == {"cancelled": 1, "error": 2}
    assert 590 < emails["oldest_ready_seconds"] < 700
    assert next(q for q in report["queues"] if q["name"] == "reports")["paused"] is True
    assert [w["worker_id"] for w in report["workers"]] == ["w-alive"]
    assert report["ok"] is True and report["problems"] == []


def test_text_shows_a_table_dead_reasons_and_workers() -> None:
    make_backlog()
    text = status()
    assert "emails" in text and "reports" in text
    assert "emails: cancelled 1, error 2" in text
    assert "Live workers: 0" in text


def test_a_stale_heartbeat_is_not_a_live_worker() -> None:
    WorkerHeartbeatFactory(worker_id="w-gone")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgqueue_worker SET last_seen_at = now() - interval '1 hour'")
    assert json.loads(status("--json"))["workers"] == []


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--max-oldest-ready", "60"], "queue emails: the oldest ready message has waited"),
        (["--max-dead", "2"], "queue emails: 3 dead messages (more than 2)"),
        (["--min-workers", "1"], "0 live workers (fewer than 1)"),
    ],
)
def test_a_crossed_threshold_exits_non_zero_with_the_reason(flags: list[str], problem: str) -> None:
    make_backlog()
    with pytest.raises(CommandError) as raised:
        status(*flags)
    assert raised.value.returncode == THRESHOLD_EXIT_CODE
    assert problem in str(raised.value)


def test_thresholds_not_crossed_exit_zero_and_paused_queues_do_not_alert() -> None:
    make_backlog()
    MessageFactory(queue="reports", available_at=timezone.now() - dt.timedelta(hours=2))
    WorkerHeartbeatFactory()
    text = status("--queue", "reports", "--max-oldest-ready", "60", "--min-workers", "1")
    assert "Problems" not in text
    status("--max-oldest-ready", "3600", "--max-dead", "3", "--min-workers", "1")


def test_a_bad_queue_name_is_refused() -> None:
    with pytest.raises(CommandError, match="queue"):
        status("--queue", "Not A Queue")


@pytest.mark.django_db(transaction=True)
def test_from_the_shell_the_exit_code_is_2_with_the_problem_on_stderr() -> None:
    """What cron sees: the real command in its own process."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url(),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "example_project")]),
    }
    command = [sys.executable, "-m", "django", "pgq_status"]
    alert = subprocess.run(
        [*command, "--min-workers", "1"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert alert.returncode == THRESHOLD_EXIT_CODE, alert.stderr
    assert "0 live workers (fewer than 1)" in alert.stderr
    assert "Live workers: 0" in alert.stdout
    healthy = subprocess.run([*command, "--json"], cwd=REPO, env=env, capture_output=True)
    assert healthy.returncode == 0 and json.loads(healthy.stdout)["ok"] is True


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "bad",
    [["--max-dead", "many"], ["--no-such-flag"], ["--max-oldest-ready", "-5"]],
    ids=["bad-value", "unknown-flag", "negative"],
)
def test_from_the_shell_bad_usage_exits_1_never_the_threshold_code(bad: list[str]) -> None:
    """A typo in a cron line must not look like an alert: usage errors exit 1, not 2."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url(),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "example_project")]),
    }
    typo = subprocess.run(
        [sys.executable, "-m", "django", "pgq_status", *bad],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert typo.returncode == 1, typo.stderr
    assert "error:" in typo.stderr and "Traceback" not in typo.stderr


def test_called_from_code_bad_usage_is_a_command_error_with_code_1() -> None:
    with pytest.raises(CommandError) as raised:
        status("--max-dead", "many")
    assert raised.value.returncode == 1


def test_waiting_messages_and_open_batches_in_json_and_text() -> None:
    from django_pgqueue import enqueue, enqueue_batch, step
    from tests.factories import BatchFactory

    head = enqueue("a", queue="emails")
    enqueue("w", queue="emails", after=[head])
    enqueue("w", queue="reports", after=[head])
    batch = enqueue_batch([step("m"), step("m")], on_success=step("ok"), label="import\nforged")
    BatchFactory(label="complete one", total=1, succeeded=1, completed_at=timezone.now())

    report = json.loads(status("--json"))
    assert report["waiting"] == {
        "default": {"value": 1, "capped": False},  # the batch's callback
        "emails": {"value": 1, "capped": False},
        "reports": {"value": 1, "capped": False},
    }
    emails = next(q for q in report["queues"] if q["name"] == "emails")
    assert emails["waiting"] == {"value": 1, "capped": False}
    assert report["open_batches"]["count"] == {"value": 1, "capped": False}
    [shown] = report["open_batches"]["newest"]
    assert shown["id"] == batch.id and shown["label"] == "import\nforged"
    assert (shown["total"], shown["succeeded"], shown["failed"], shown["pending"]) == (2, 0, 0, 2)

    text = status()
    assert "Waiting on dependencies or a batch:\n  default: 1\n  emails: 1\n" in text
    assert "Open batches: 1\n" in text
    rows = [line.split() for line in text.split("Open batches: 1\n")[1].splitlines()[:2]]
    assert rows == [["batch", "label", "done", "failed", "total"],
                    [str(batch.id), "import?forged", "0", "0", "2"]]  # fmt: skip
    assert "complete one" not in text

    only = json.loads(status("--json", "--queue", "emails"))
    assert list(only["waiting"]) == ["emails"]


def test_open_batches_are_bounded_newest_first() -> None:
    from django_pgqueue.composition.progress import OPEN_BATCHES_SHOWN
    from tests.factories import BatchFactory

    made = BatchFactory.create_batch(OPEN_BATCHES_SHOWN + 2)
    report = json.loads(status("--json"))
    assert report["open_batches"]["count"]["value"] == OPEN_BATCHES_SHOWN + 2
    newest = [b["id"] for b in report["open_batches"]["newest"]]
    assert newest == sorted((b.id for b in made), reverse=True)[:OPEN_BATCHES_SHOWN]
    assert f"Open batches: {OPEN_BATCHES_SHOWN + 2} (the newest {OPEN_BATCHES_SHOWN})" in status()
