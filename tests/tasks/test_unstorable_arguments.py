"""Through django.tasks: what the queue cannot store is refused before any write, as an
``InvalidTask`` that is also django-pgqueue's ``InvalidMessage``."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection, transaction

from django_pgqueue.exceptions import InvalidMessage, PayloadError
from django_pgqueue.models import Message
from django_pgqueue.tasks import InvalidTaskMessage, enqueue_on_commit
from django_pgqueue.tasks.framework import InvalidTask
from tests.taskapp import tasks as t

pytestmark = pytest.mark.django_db(transaction=True)

BAD_ARGUMENTS = {
    "nul": (("a\x00b",), {}),
    "surrogate": (("a\ud800",), {}),
    "surrogate-in-kwargs": ((), {"b": ["\udfff"]}),
    "surrogate-key": ((), {"b": {"\ud800": 1}}),
}


@pytest.mark.parametrize(("args", "kwargs"), BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_unstorable_arguments_are_refused_in_the_callers_transaction(args, kwargs):
    with transaction.atomic():
        with pytest.raises(InvalidTaskMessage, match=r"[Pp]ayload") as raised:
            t.add.enqueue(*args, **kwargs)
        with connection.cursor() as cursor:  # the caller's transaction goes on
            cursor.execute("SELECT 1")
        t.add.enqueue(1, 2)
    assert isinstance(raised.value, InvalidTask) and isinstance(raised.value, InvalidMessage)
    assert isinstance(raised.value.__cause__, PayloadError)
    assert Message.objects.count() == 1


@pytest.mark.parametrize(("args", "kwargs"), BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_enqueue_on_commit_refuses_unstorable_arguments_at_once(args, kwargs):
    with transaction.atomic():
        with pytest.raises(InvalidTaskMessage, match=r"[Pp]ayload"):
            enqueue_on_commit(t.add, *args, **kwargs)
    assert Message.objects.count() == 0


FAR = {
    "timedelta-1e8-days": dt.timedelta(days=10**8),
    "timedelta-max": dt.timedelta(days=999_999_999),
    "datetime-max-utc": dt.datetime.max.replace(tzinfo=dt.UTC),
    "datetime-min-utc": dt.datetime.min.replace(tzinfo=dt.UTC),
}


@pytest.mark.parametrize("run_after", FAR.values(), ids=FAR.keys())
def test_run_after_out_of_range_is_refused_before_any_write(run_after):
    with transaction.atomic():
        with pytest.raises(InvalidTaskMessage, match="run_after"):
            t.add.using(run_after=run_after).enqueue(1, 2)
        with pytest.raises(InvalidTaskMessage, match="run_after"):
            enqueue_on_commit(t.add.using(run_after=run_after), 1, 2)
        t.add.enqueue(1, 2)
    assert Message.objects.count() == 1
