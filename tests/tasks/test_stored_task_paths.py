"""get_result() reads a task path from a row: it resolves only tasks, never imports anything.

Anyone who can write the table controls that path, so it may name a task known in this
process, or one in a module already imported or of an installed app, and nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings

import django_pgqueue
from django_pgqueue.tasks.framework import TaskResultDoesNotExist, task_backends
from django_pgqueue.tasks.results import find_task

pytestmark = pytest.mark.django_db

TASK_PAYLOAD = {"args": [], "kwargs": {}}


def result_of(path: str, payload: object = TASK_PAYLOAD):
    message = django_pgqueue.enqueue(path, payload)
    return task_backends["default"].get_result(str(message.id))


@pytest.mark.parametrize(
    "path",
    [
        "this.x",  # prints the Zen of Python when imported
        "tests.tasks.import_canary.looks_like_a_task",  # a task, outside the installed apps
        "tests.tasks.import_canary.x",
    ],
)
def test_a_stored_path_never_imports_a_module_outside_the_installed_apps(path):
    module = path.rpartition(".")[0]
    assert module not in sys.modules
    with pytest.raises(TaskResultDoesNotExist):
        result_of(path)
    assert module not in sys.modules


def test_a_stored_path_to_antigravity_imports_nothing():
    # Checked in a fresh interpreter: importing antigravity would open a web browser.
    code = (
        "import django, sys; django.setup()\n"
        "from django_pgqueue.tasks.results import find_task\n"
        "assert find_task('antigravity.fly') is None\n"
        "assert find_task('webbrowser.open') is None\n"
        "assert 'antigravity' not in sys.modules and 'webbrowser' not in sys.modules\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join(path for path in sys.path if path),
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=settings.REPO_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "path",
    [
        "os.system",  # imported already, not a task
        "tests.testapp.models.x",  # an installed app's module, no such name
        "tests.taskapp.tasks._log",  # an installed app's module, not a task
        "tests.taskapp.tasks.add.func",  # not an identifier path to a task
        "tests.testapp..tasks.add",
        "tests.taskapp.tasks.add ",
        "add",
        "",
    ],
)
def test_a_stored_path_that_names_no_task_finds_nothing(path):
    assert find_task(path) is None


def test_a_task_of_another_backend_kind_is_not_a_result_of_this_one():
    # runs_at_once is a task of the immediate backend: no row of ours can hold it.
    with pytest.raises(TaskResultDoesNotExist):
        result_of("tests.taskapp.tasks.runs_at_once")


def test_a_task_in_an_installed_apps_module_not_yet_imported_is_found():
    path = "tests.taskapp.late_tasks.imported_on_demand"
    result = result_of(path, {"args": [3], "kwargs": {}})
    assert result.task.module_path == path and result.args == [3]
