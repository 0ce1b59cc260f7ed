"""The example project's django.tasks use: enqueue from a view, follow the result by id."""

from __future__ import annotations

import io

import pytest
from demo.models import Signup
from demo.tasks import signup_digest
from django.test import Client

from django_pgqueue.core import transitions
from django_pgqueue.models import Message
from tests.tasks.test_execution import run

pytestmark = pytest.mark.django_db


def test_digest_view_enqueues_and_status_view_follows_it() -> None:
    Signup.objects.create(email="a@example.com")
    client = Client()
    response = client.post("/tasks/digest/", {"note": "hi"})
    assert response.status_code == 201
    task_id = response.json()["task_id"]
    assert client.get(f"/tasks/{task_id}/").json()["status"] == "READY"

    _, value = run()
    assert value == {"signups": 1, "welcomed": 0, "note": "hi", "attempt": 1}

    transitions.complete(list(Message.objects.all()), [value])
    body = client.get(f"/tasks/{task_id}/").json()
    assert body["status"] == "SUCCESSFUL" and body["return_value"] == value
    assert body["attempts"] == 1 and body["errors"] == []
    assert signup_digest.get_result(task_id).return_value == value


def test_status_of_an_unknown_task_is_404() -> None:
    assert Client().get("/tasks/12345/").status_code == 404
    assert Client().get("/tasks/not-a-number/").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_demo_data_leaves_a_dead_message_for_the_retry_actions() -> None:
    from django.core.management import call_command

    from django_pgqueue.models import ArchivedMessage, DeadMessage

    call_command("demo_setup", signups=2, stdout=io.StringIO())
    call_command("pgq_worker", "--burst", stdout=io.StringIO(), stderr=io.StringIO())
    dead = DeadMessage.objects.get()
    assert (dead.task, dead.reason) == ("demo.sync-crm", "error")
    assert "refused the connection" in str(dead.details)
    assert ArchivedMessage.objects.count() == 3  # two welcomes and the digest task
    assert not Message.objects.exists()


def test_the_example_site_is_not_in_debug_and_has_no_key_unless_told(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    if (repo / ".env").exists() or (repo / "example_project" / ".env").exists():
        pytest.skip("a .env file sets the example site's settings here")
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "SECRET_KEY")}
    env["PYTHONPATH"] = os.pathsep.join([str(repo), str(repo / "example_project")])
    code = (
        "from example_project import settings\nprint(settings.DEBUG, repr(settings.SECRET_KEY))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "''"]
