"""The example project's django.tasks use: enqueue from a view, follow the result by id."""

from __future__ import annotations

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
