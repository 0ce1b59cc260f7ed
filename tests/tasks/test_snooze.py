"""A django.tasks task raising ``Snooze`` runs again without spending an attempt."""

from __future__ import annotations

from pathlib import Path

from django_pgqueue.models import ArchivedMessage
from django_pgqueue.tasks.framework import TaskResultStatus
from tests.taskapp import tasks as t

from .test_worker import pytestmark as worker_marks
from .test_worker import run_worker

pytestmark = worker_marks


def test_a_task_that_snoozes_runs_again_on_the_same_attempt(tmp_path: Path) -> None:
    result = t.snooze_once.enqueue(str(tmp_path / "snoozed"))
    run_worker(tmp_path / "signals.jsonl")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "woke"
    assert result.attempts == 1 and result.errors == []
    assert ArchivedMessage.objects.get(message_id=int(result.id)).attempts == 1
