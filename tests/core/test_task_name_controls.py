"""Task names with control characters are refused on every path that names a task, and a
name stored by other means is logged escaped (``printable``).

A newline or an escape sequence in a task name would let whoever enqueues write a fake log
line or drive the terminal that shows the log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import django_pgqueue
from django_pgqueue.core._validation import printable
from django_pgqueue.exceptions import InvalidMessage, PipelineError
from django_pgqueue.models import Message
from django_pgqueue.periodic import periodic
from django_pgqueue.pipeline.enqueue import check_target

pytestmark = pytest.mark.django_db(transaction=True)

CONTROLS = {
    "newline": "a\nb",
    "escape": "\x1b[31m",
    "carriage-return": "ok\rFAKE",
    "delete": "a\x7f",
    "c1-next-line": "a\x85b",
    "line-separator": "a\u2028b",
}


def enqueue_many(name: str) -> None:
    django_pgqueue.enqueue_many(name, [{}, {}])


PATHS: dict[str, Callable[[str], Any]] = {
    "enqueue": lambda name: django_pgqueue.enqueue(name, {}),
    "enqueue_on_commit": lambda name: django_pgqueue.enqueue_on_commit(name, {}),
    "enqueue_many": enqueue_many,
    "handler": lambda name: django_pgqueue.handler(name)(lambda payload: None),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", CONTROLS.values(), ids=CONTROLS.keys())
def test_enqueue_refuses_control_characters_in_the_task_name(path: str, name: str) -> None:
    with pytest.raises(InvalidMessage, match=r"Invalid task name .*control character U\+"):
        PATHS[path](name)
    assert Message.objects.count() == 0


def test_the_error_names_the_character_and_its_place() -> None:
    with pytest.raises(InvalidMessage) as caught:
        django_pgqueue.enqueue("emails.send\x1b[31m", {})
    assert "U+001B at character 11" in str(caught.value)
    assert "\x1b" not in str(caught.value)  # the message itself is safe to log


def test_a_periodic_schedule_refuses_control_characters() -> None:
    with pytest.raises(InvalidMessage, match="control character U\\+001B"):
        periodic(every=60, task="report\x1b[2J")(lambda payload: None)


def test_the_pipeline_target_refuses_control_characters() -> None:
    with pytest.raises(PipelineError, match="control character U\\+000A"):
        check_target(task="a\nb")


def test_printable_names_are_logged_as_they_are() -> None:
    for name in ("emails.send-welcome", "tâche.été", "中文.任务", "a b"):
        assert printable(name) == name


def test_other_names_are_logged_escaped_on_one_line() -> None:
    assert printable("a\nERROR forged") == "a\\nERROR forged"
    assert printable("\x1b[31mred") == "\\x1b[31mred"
    assert printable("a\x85\u2028\x7f") == "a\\x85\\u2028\\x7f"
