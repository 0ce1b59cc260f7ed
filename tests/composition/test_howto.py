"""The compose-work how-to's examples run as written, and do what it says."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from django_pgqueue.core._registry import registry
from django_pgqueue.models import Batch, Message, WaitingMessage

from .helpers import finish, where

pytestmark = pytest.mark.django_db(transaction=True)

HOWTO = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "compose-work.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", HOWTO.read_text(), re.DOTALL)


@pytest.fixture
def namespace() -> Any:
    names = set(registry.names())
    found: dict[str, Any] = {}
    for block in blocks():
        exec(block, found)
    yield found
    for name in set(registry.names()) - names:
        registry.unregister(name)


def test_every_example_runs_and_writes_what_it_says(namespace: dict[str, Any]) -> None:
    publish, order, batch = namespace["publish"], namespace["order"], namespace["batch"]
    assert where(publish.id) == "waiting"
    assert [where(i) for i in order.ids] == ["live", "waiting", "waiting"]
    assert where(namespace["notify"].id) == "waiting"
    assert Batch.objects.get(id=batch.id).total == 50 and len(batch.member_ids) == 50
    # The chain's second step reads what the first returned.
    finish(order.ids[0], result={"amount": 12})
    context = SimpleNamespace(message_id=order.ids[1])
    assert namespace["charge"](context, {"order": 42}) == {"charged": 12}
    # The batch's success callback reads the batch and its members' results.
    finish(*batch.member_ids, result="page")
    assert where(batch.on_success.id) == "live" and where(batch.on_failure.id) == "nowhere"
    context = SimpleNamespace(message_id=batch.on_success.id)
    assert namespace["assemble"](context, {"report": 9}) == {"pages": 50, "of": 50}
    # The on_commit example wrote its chain when the (autocommit) block ran.
    assert Message.objects.filter(task="a").count() == 1
    assert WaitingMessage.objects.filter(task="b").count() == 1
