"""``run_now(name)``: one extra run of a schedule, in the caller's transaction, as the
periodic-jobs how-to shows it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from django_pgqueue.models import Message, PeriodicSchedule
from django_pgqueue.periodic import Schedule, Ticker

pytestmark = pytest.mark.django_db(transaction=True)

# The module, not the decorator that django_pgqueue exports under the same name.
periodic_module = importlib.import_module("django_pgqueue.periodic")

HOWTO = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "periodic-jobs.md"
REFRESH = Schedule(name="reports.refresh", task="tests.echo", every=300, queue="reports")


@pytest.fixture
def declared(monkeypatch: Any) -> PeriodicSchedule:
    monkeypatch.setattr(periodic_module, "_SCHEDULES", {REFRESH.name: REFRESH})
    Ticker("default", [REFRESH]).sync()
    return PeriodicSchedule.objects.get(name=REFRESH.name)


def documented_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", HOWTO.read_text(), re.DOTALL)
    (example,) = [block for block in blocks if "run_now(" in block]
    return example


def test_the_documented_example_enqueues_one_run_now(declared: PeriodicSchedule) -> None:
    namespace: dict[str, Any] = {}
    exec(documented_example(), namespace)
    [message] = Message.objects.all()
    assert namespace["message_id"] == message.id
    assert (message.task, message.queue) == ("tests.echo", "reports")
    assert message.payload["periodic"] == "reports.refresh"
    row = PeriodicSchedule.objects.get(name=REFRESH.name)
    assert row.last_message_id == message.id and row.next_run_at == declared.next_run_at


def test_it_is_rolled_back_with_the_callers_transaction(declared: PeriodicSchedule) -> None:
    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        periodic_module.run_now(REFRESH.name)
        assert Message.objects.count() == 1
        raise Undo
    assert not Message.objects.exists()
    assert PeriodicSchedule.objects.get(name=REFRESH.name).last_message_id is None


def test_a_name_the_code_does_not_declare_is_a_lookup_error(declared: PeriodicSchedule) -> None:
    with pytest.raises(LookupError, match=r"no periodic schedule 'reports\.gone'"):
        periodic_module.run_now("reports.gone")
    assert not Message.objects.exists()
