"""Supported Django versions: without a Tasks framework (Django 5.2 without the django-tasks
backport) the queue, the worker and the admin load, and only ``django_pgqueue.tasks`` says
what to install. Each case runs in a fresh interpreter where ``django.tasks`` and
``django_tasks`` cannot be imported, as on a bare Django 5.2."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from django_pgqueue.compat import TASKS_FRAMEWORK

REPO_DIR = Path(__file__).resolve().parents[2]

# A module set to None in sys.modules cannot be imported and find_spec() reports it absent.
WITHOUT_TASKS_FRAMEWORK = """
import sys
sys.modules["django.tasks"] = None
sys.modules["django_tasks"] = None
"""


def run_without_tasks_framework(body: str) -> subprocess.CompletedProcess[str]:
    code = WITHOUT_TASKS_FRAMEWORK + textwrap.dedent(body)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join([str(REPO_DIR), str(REPO_DIR / "example_project")]),
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO_DIR,
        env=env,
        check=False,
        timeout=120,
    )


def test_the_app_loads_and_checks_pass_without_a_tasks_framework() -> None:
    done = run_without_tasks_framework(
        """
        import django
        django.setup()
        from django.core.management import call_command
        call_command("check", fail_level="WARNING")

        from django.urls import reverse
        import django_pgqueue.admin, django_pgqueue.worker.runner
        from django_pgqueue.compat import TASKS_FRAMEWORK
        from django_pgqueue.management.commands import pgq_worker
        from django_pgqueue.worker.discovery import autodiscover
        assert TASKS_FRAMEWORK is None
        assert "tests.echo" in autodiscover()
        assert reverse("admin:django_pgqueue_deadmessage_changelist")
        print("loaded")
        """
    )
    assert done.returncode == 0, done.stderr
    assert "loaded" in done.stdout


def test_the_tasks_backend_says_what_to_install_without_a_tasks_framework() -> None:
    done = run_without_tasks_framework(
        """
        try:
            import django_pgqueue.tasks
        except ImportError as exc:
            print(exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "django-pgqueue-mq[tasks]" in done.stdout
    assert "Django 6.0 or newer" in done.stdout


@pytest.mark.skipif(TASKS_FRAMEWORK is None, reason="needs a Tasks framework")
def test_the_tasks_backend_uses_the_framework_there_is() -> None:
    from django_pgqueue.tasks import PgQueueBackend
    from django_pgqueue.tasks.framework import BaseTaskBackend

    assert issubclass(PgQueueBackend, BaseTaskBackend)
    assert BaseTaskBackend.__module__.startswith(f"{TASKS_FRAMEWORK}.")
