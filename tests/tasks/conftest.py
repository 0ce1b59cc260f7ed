"""The Tasks backend tests need a Tasks framework: ``django.tasks`` (Django 6.0+) or the
``django-tasks`` backport on Django 5.2. Without one they are not collected (the session
header says so); ``tests/unit/test_compat.py`` checks what happens then."""

from pathlib import Path

import pytest

from django_pgqueue.compat import TASKS_FRAMEWORK

if TASKS_FRAMEWORK is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture
def signal_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "signals.jsonl"
    path.touch()
    monkeypatch.setenv("PGQ_TASKS_SIGNAL_LOG", str(path))  # task_enqueued, in this process
    return path
