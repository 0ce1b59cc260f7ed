"""A task name written by other means than ``enqueue`` (raw SQL, an older release) cannot
forge a log line: a real worker logs it escaped, on the line it belongs to."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.acceptance.conftest import WorkerProcess, spawn_worker  # noqa: F401 (fixture)
from tests.factories import MessageFactory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

CRAFTED = "evil\n2026-01-01 00:00:00 ERROR django_pgqueue.worker: forged\x1b[2J\r"


def test_a_crafted_task_name_is_logged_escaped_on_one_line(
    spawn_worker: Callable[..., WorkerProcess],  # noqa: F811
) -> None:
    # Rows as raw SQL would write them: no enqueue() check on the way in.
    rejected = MessageFactory(task=CRAFTED)
    redelivered = MessageFactory(task=CRAFTED, expired=True)
    buried = MessageFactory(task=CRAFTED, expired=True, attempts=3, max_attempts=3)
    worker = spawn_worker("--burst", "--no-listen")
    assert worker.wait() == 0, worker.output
    for message_id, what in [
        (rejected.id, "dead-lettered: rejected"),
        (redelivered.id, "redelivered"),
        (buried.id, "dead-lettered: lease_expired"),
    ]:
        line = worker.wait_for_line(rf"Message {message_id} \(.*\) {what}")
        assert "evil\\n2026-01-01 00:00:00 ERROR django_pgqueue.worker: forged\\x1b[2J\\r" in line
    assert not any("\x1b" in line for line in worker.lines), worker.output
    # The name's text only ever shows inside a line the worker wrote about its message.
    forged = [line for line in worker.lines if "forged" in line]
    assert forged and all(" Message " in line for line in forged), worker.output
