"""A result's ``TaskError.exception_class`` comes from a type name stored in the row, which
anyone able to write the table controls: it resolves to a built-in or an already imported
class, else to ``Exception``, and never imports a module (issue #58)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from django.db import connection

import django_pgqueue
from django_pgqueue.tasks.framework import TaskResultStatus, task_backends
from django_pgqueue.tasks.results import LeaseExpired, TaskTimeout, task_error

pytestmark = pytest.mark.django_db

CANARY = "tests.tasks.error_canary"


def dead_result_with_errors(errors: list[dict]):
    message = django_pgqueue.enqueue("tests.taskapp.tasks.add", {"args": [1, 2], "kwargs": {}})
    with connection.cursor() as cursor:
        cursor.execute(
            """WITH moved AS (DELETE FROM pgqueue_message WHERE id = %s RETURNING *)
               INSERT INTO pgqueue_dead (message_id, queue, task, payload, enqueued_at,
                   attempts, max_attempts, errors, reason, details, died_at)
               SELECT id, queue, task, payload, enqueued_at, 1, 1, %s::jsonb, 'error',
                      '{}'::jsonb, now() FROM moved""",
            [message.id, json.dumps(errors)],
        )
    return task_backends["default"].get_result(str(message.id))


def test_a_stored_error_type_never_imports_the_module_it_names() -> None:
    assert CANARY not in sys.modules
    stored = {"attempt": 1, "type": f"{CANARY}.CanaryError", "message": "planted"}

    result = dead_result_with_errors([stored])

    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class is Exception
    assert error.traceback == f"{CANARY}.CanaryError: planted\n"  # what was stored, as text
    assert CANARY not in sys.modules and "PGQ_ERROR_CANARY_IMPORTED" not in os.environ


@pytest.mark.parametrize(
    ("stored", "resolved"),
    [
        ("builtins.KeyError", KeyError),
        ("ValueError", ValueError),
        ("json.decoder.JSONDecodeError", json.JSONDecodeError),  # imported already
        ("Timeout", TaskTimeout),
        ("LeaseExpired", LeaseExpired),
        ("Mystery", Exception),
        ("os.path", Exception),  # imported, not an exception class
        ("json.loads", Exception),
        ("builtins.print", Exception),
        ("this.x", Exception),  # importing it prints the Zen of Python
        ("json..", Exception),
        ("", Exception),
    ],
)
def test_error_types_resolve_to_known_classes_or_exception(stored: str, resolved: type) -> None:
    error = task_error({"type": stored, "message": "why"})
    assert error.exception_class is resolved
    assert "this" not in sys.modules


def test_a_cut_error_history_gives_one_task_error_per_attempt_kept() -> None:
    kept = [{"attempt": n, "type": "builtins.ValueError", "message": "m"} for n in (1, 2)]

    result = dead_result_with_errors([kept[0], {"omitted": 30}, kept[1]])

    assert [e.exception_class for e in result.errors] == [ValueError, ValueError]
