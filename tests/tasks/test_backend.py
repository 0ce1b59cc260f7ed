"""PgQueueBackend: enqueue mapping onto message rows, and Django's validation rules."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_pgqueue.core._registry import registry
from django_pgqueue.models import Message
from django_pgqueue.tasks import PgQueueBackend, PgQueueTask
from django_pgqueue.tasks.framework import InvalidTask, TaskResultStatus, task_backends
from tests.taskapp import tasks as t

pytestmark = pytest.mark.django_db


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_backend_declares_full_support() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, PgQueueBackend)
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority
    assert backend.task_class is PgQueueTask


def test_backend_init_touches_no_database(django_assert_num_queries) -> None:
    with django_assert_num_queries(0):
        backend = PgQueueBackend("x", {"QUEUES": ["a"], "OPTIONS": {"max_attempts": 2}})
    assert backend.queues == {"a"}


def test_enqueue_writes_one_message_row() -> None:
    result = t.add.using(priority=7).enqueue((1, 2), b=b"x")
    row = Message.objects.get(pk=int(result.id))
    assert row.task == "tests.taskapp.tasks.add"
    assert row.payload == {"args": [[1, 2]], "kwargs": {"b": "x"}}
    assert row.priority == 7
    assert row.queue == "default"
    assert row.attempts == 0
    assert row.max_attempts == 3  # PGQUEUE default
    assert result.status == TaskResultStatus.READY
    assert result.args == [[1, 2]] and result.kwargs == {"b": "x"}
    assert result.enqueued_at == row.enqueued_at
    assert result.worker_ids == [] and result.errors == [] and result.attempts == 0
    assert result.backend == "default"
    assert result.task.func is t.add.func


def test_max_attempts_from_task_then_options_then_pgqueue() -> None:
    flaky = Message.objects.get(pk=int(t.flaky.enqueue(2).id))
    assert flaky.max_attempts == 3
    fails = Message.objects.get(pk=int(t.always_fails.enqueue("x").id))
    assert fails.max_attempts == 2
    tasks_setting = {
        "default": {
            "BACKEND": "django_pgqueue.tasks.PgQueueBackend",
            "OPTIONS": {"max_attempts": 9},
        }
    }
    with override_settings(TASKS=tasks_setting):
        row = Message.objects.get(pk=int(t.add.enqueue(1, 1).id))
    assert row.max_attempts == 9


def test_queue_name_maps_to_the_message_queue() -> None:
    result = t.async_add.enqueue(1, 2)
    assert Message.objects.get(pk=int(result.id)).queue == "tasks-other"


def test_run_after_datetime_becomes_available_at() -> None:
    when = timezone.now() + dt.timedelta(hours=1)
    result = t.add.using(run_after=when).enqueue(1, 2)
    assert Message.objects.get(pk=int(result.id)).available_at == when
    assert result.task.run_after == when
    assert t.add.get_result(result.id).task.run_after == when


def test_run_after_timedelta_is_added_to_database_time() -> None:
    # Django documents a timedelta but its own validate_task crashes on one; we accept it.
    result = t.add.using(run_after=dt.timedelta(minutes=5)).enqueue(1, 2)  # type: ignore[arg-type]
    row = Message.objects.get(pk=int(result.id))
    # Added to the database clock at the INSERT (statement time, like enqueued_at).
    assert row.available_at == row.enqueued_at + dt.timedelta(minutes=5)
    assert row.enqueued_at >= db_now()
    assert result.task.run_after == row.available_at


def test_negative_timedelta_is_refused() -> None:
    with pytest.raises(InvalidTask, match="negative"):
        t.add.using(run_after=dt.timedelta(seconds=-1))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((dt.datetime(2026, 1, 1),), {}, "JSON"),
        ((math.nan,), {}, "JSON"),
        ((), {"b": {1: "int key"}}, "round-trip"),
        ((object(),), {}, "JSON"),
    ],
)
def test_non_json_arguments_raise_invalid_task(args, kwargs, match) -> None:
    before = Message.objects.count()
    with pytest.raises(InvalidTask, match=match):
        t.add.enqueue(*args, **kwargs)
    assert Message.objects.count() == before


def test_queue_not_in_queues_raises_invalid_task() -> None:
    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid"):
        t.add.using(queue_name="nope")


def test_queue_name_must_fit_the_tables() -> None:
    with override_settings(
        TASKS={"default": {"BACKEND": "django_pgqueue.tasks.PgQueueBackend", "QUEUES": []}}
    ):
        with pytest.raises(InvalidTask, match="Invalid queue name"):
            t.add.using(queue_name="Has Spaces")


@pytest.mark.parametrize("priority", [101, -101, 1.5])
def test_priority_out_of_range_raises_invalid_task(priority) -> None:
    with pytest.raises(InvalidTask, match="priority"):
        t.add.using(priority=priority)


def test_naive_run_after_raises_invalid_task() -> None:
    with pytest.raises(InvalidTask, match="aware"):
        t.add.using(run_after=dt.datetime(2030, 1, 1))


def test_validate_task_runs_again_at_enqueue() -> None:
    # A task built for another backend (no queue validation) checked against ours on enqueue.
    loose = t.add.using(backend="dummy", queue_name="elsewhere")
    with pytest.raises(InvalidTask, match="Queue 'elsewhere'"):
        task_backends["default"].enqueue(loose, (), {})


def test_task_options_are_validated() -> None:
    def bad(x: int) -> int:
        return x

    bad.__qualname__ = "bad"  # module level as far as Django's check is concerned
    # Django 6.0's Task has no defaults for these: give them all.
    fields = {"priority": 0, "backend": "default", "queue_name": "default", "run_after": None}
    with pytest.raises(InvalidTask, match="max_attempts"):
        PgQueueTask(func=bad, max_attempts=0, **fields)
    with pytest.raises(InvalidTask, match="timeout"):
        PgQueueTask(func=bad, timeout=-1, **fields)


def test_task_decorator_carries_options_through_using() -> None:
    assert isinstance(t.flaky, PgQueueTask)
    moved = t.flaky.using(priority=3, queue_name="tasks-other")
    assert isinstance(moved, PgQueueTask)
    assert (moved.max_attempts, moved.backoff, moved.priority) == (3, 0, 3)


def test_task_is_registered_with_the_worker() -> None:
    handler = registry.get("tests.taskapp.tasks.flaky")
    assert handler is not None
    assert handler.takes_context
    assert (handler.max_attempts, handler.backoff_base) == (3, 0)
    async_handler = registry.get("tests.taskapp.tasks.async_add")
    assert async_handler is not None and async_handler.is_async


def test_task_decorator_works_with_other_backends() -> None:
    assert isinstance(t.on_dummy, PgQueueTask) and t.on_dummy.max_attempts == 4
    result = t.on_dummy.enqueue(2)
    assert result.status == TaskResultStatus.READY
    assert not Message.objects.filter(task=t.on_dummy.module_path).exists()


def test_check_reports_bad_options_and_queue_names() -> None:
    backend = PgQueueBackend(
        "broken", {"QUEUES": ["Bad Name"], "OPTIONS": {"max_attempts": 0, "colour": "red"}}
    )
    ids = sorted(m.id for m in backend.check())
    assert ids == ["django_pgqueue.E020", "django_pgqueue.E020", "django_pgqueue.E022"]
    assert task_backends["default"].check() == []


def test_aenqueue_and_aget_result() -> None:
    async def go() -> tuple[str, TaskResultStatus]:
        result = await t.add.aenqueue(2, 3)
        fetched = await t.add.aget_result(result.id)
        return result.id, fetched.status

    result_id, status = async_to_sync(go)()
    assert status == TaskResultStatus.READY
    assert Message.objects.get(pk=int(result_id)).payload == {"args": [2, 3], "kwargs": {}}


def test_payload_over_the_cap_raises_invalid_task(settings) -> None:
    settings.PGQUEUE = {"MAX_PAYLOAD_BYTES": 64}
    with pytest.raises(InvalidTask, match="64-byte cap"):
        t.add.enqueue("x" * 100, 1)
    assert not Message.objects.exists()


def test_manage_py_check_runs_the_backend_check(settings) -> None:
    from django.core import checks

    settings.TASKS = {
        "default": {
            "BACKEND": "django_pgqueue.tasks.PgQueueBackend",
            "OPTIONS": {"timeout": "soon"},
        }
    }
    ids = [m.id for m in checks.run_checks()]
    assert "django_pgqueue.E020" in ids
    with pytest.raises(ImproperlyConfigured, match="timeout"):
        t.add.enqueue(1, 2)


def test_backend_imports_before_apps_are_ready() -> None:
    # @task builds the backend at import time, possibly before django.setup().
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from django.conf import settings\n"
        "settings.configure(USE_TZ=True, TASKS={'default': "
        "{'BACKEND': 'django_pgqueue.tasks.PgQueueBackend'}})\n"
        "from django_pgqueue.tasks.framework import task_backends\n"
        "backend = task_backends['default']\n"
        "assert type(backend).__name__ == 'PgQueueBackend'\n"
        "assert 'django_pgqueue.models' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(
    not t.DJANGO_TASK_FORWARDS_OPTIONS, reason="Django 6.0's @task takes no extra options"
)
def test_djangos_own_decorator_forwards_our_options() -> None:
    assert isinstance(t.via_django_decorator, PgQueueTask)
    assert (t.via_django_decorator.max_attempts, t.via_django_decorator.backoff) == (4, 0.5)
    row = Message.objects.get(pk=int(t.via_django_decorator.enqueue(1).id))
    assert row.max_attempts == 4


def test_immediate_test_backend_runs_pgqueue_tasks_in_process() -> None:
    result = t.runs_at_once.enqueue(4)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 40
    assert not Message.objects.exists()
