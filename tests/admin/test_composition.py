"""Composition in the admin: batches with their members, failed members and callbacks, and
"Retry failed members"; waiting messages with what they wait on and Cancel; each message's
dependencies, dependents and batch; the reason ``dependency_failed`` linked to its cause."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgqueue import chain, enqueue, enqueue_batch, enqueue_chain, step
from django_pgqueue.admin.compat import CHANGE_FORM_ACTIONS
from django_pgqueue.composition.progress import MEMBER_SCAN_CAP, member_states
from django_pgqueue.models import ArchivedMessage, Batch, DeadMessage, Message, WaitingMessage
from tests.admin.conftest import StaffClient
from tests.composition.helpers import bury, finish, where
from tests.factories import BatchFactory

pytestmark = pytest.mark.django_db(transaction=True)

COMPOSITION_VIEW = ["view_batch", "view_waitingmessage"]


def _url(name: str, *args: Any) -> str:
    return reverse(f"admin:django_pgqueue_{name}", args=args)


def _dead_pk(message_id: int) -> int:
    return DeadMessage.objects.get(message_id=message_id).pk


def failed_batch() -> Any:
    """A batch of a plain member that finished, one that died, and a chain whose first step
    died: complete with two failed members, its success callback buried."""
    batch = enqueue_batch(
        [step("m", {"i": 1}), step("m", {"i": 2}), chain(step("a"), step("b"))],
        on_complete=step("done"),
        on_success=step("ok"),
        on_failure=step("ko"),
        label="nightly <import>",
    )
    good, bad, last = batch.member_ids
    [first] = Message.objects.filter(task="a").values_list("id", flat=True)
    finish(good)
    bury(bad)
    bury(first)
    assert where(last) == "dead"
    return batch, good, bad, first, last


def test_the_batch_list_shows_progress_and_state(staff_client: StaffClient) -> None:
    running = enqueue_batch([step("m"), step("m")], label="running one")
    finish(running.member_ids[0])
    failed, *_ = failed_batch()
    client = staff_client(*COMPOSITION_VIEW)
    page = client.get(_url("batch_changelist"))
    assert page.status_code == 200
    text = page.text
    assert "running one" in text and "nightly &lt;import&gt;" in text
    assert "1 / 0 / 2" in text and "1 / 2 / 3" in text
    assert '<span title="complete, with failed members">failed</span>' in text
    running_only = client.get(_url("batch_changelist"), {"state": "running"}).text
    assert "running one" in running_only and "nightly" not in running_only
    failed_only = client.get(_url("batch_changelist"), {"state": "failed"}).text
    assert "nightly" in failed_only and "running one" not in failed_only
    found = client.get(_url("batch_changelist"), {"q": str(failed.id)}).context["cl"]
    assert [b.id for b in found.result_list] == [failed.id]
    assert client.get(_url("batch_changelist"), {"q": "x"}).context["cl"].result_count == 0


def test_a_batch_page_shows_members_by_state_failures_and_callbacks(
    staff_client: StaffClient,
) -> None:
    batch, _, bad, first, last = failed_batch()
    client = staff_client(*COMPOSITION_VIEW)
    page = client.get(_url("batch_change", batch.id))
    assert page.status_code == 200
    text = page.text
    # finished 1, dead 2, nothing live or waiting
    assert "<th>finished</th><td>1</td>" in text and "<th>dead</th><td>2</td>" in text
    assert "<th>live</th><td>0</td>" in text and "<th>waiting</th><td>0</td>" in text
    # Each failed member links to its dead page; the chain's last step names the failed step.
    assert _url("deadmessage_change", _dead_pk(bad)) in text
    assert _url("deadmessage_change", _dead_pk(last)) in text
    assert "dependency_failed" in text and _url("deadmessage_change", _dead_pk(first)) in text
    # The callbacks: completion and failure live, success buried until the batch succeeds.
    assert batch.on_complete and batch.on_failure and batch.on_success
    assert _url("message_change", batch.on_complete.id) in text
    assert _url("message_change", batch.on_failure.id) in text
    assert f"#{batch.on_success.id}</a> (dead: dependency_failed)" in text
    # Not permitted to retry: no button.
    assert "Retry failed members" not in text


def test_a_running_batch_splits_its_unfinished_members_into_live_and_waiting() -> None:
    batch = enqueue_batch([step("m"), chain(step("a"), step("b")), step("m")])
    finish(batch.member_ids[0])
    states = member_states(Batch.objects.get(id=batch.id))
    assert (states.finished, states.dead, states.live, states.waiting) == (1, 0, 1, 1)


def test_a_big_batch_is_not_walked_member_by_member() -> None:
    big = BatchFactory(total=MEMBER_SCAN_CAP + 1, succeeded=10, failed=1)
    with CaptureQueriesContext(connection) as queries:
        states = member_states(big)
    assert len(queries) == 0
    assert (states.finished, states.dead, states.pending) == (10, 1, MEMBER_SCAN_CAP - 10)
    assert states.live is None and states.waiting is None


def test_retry_failed_members_counts_them_back_and_the_success_callback_runs(
    staff_client: StaffClient,
) -> None:
    batch, _, bad, first, last = failed_batch()
    assert batch.on_success
    client = staff_client(*COMPOSITION_VIEW, "retry_deadmessage")
    assert 'value="retry_failed_members"' in client.get(_url("batch_changelist")).text

    response = client.post(
        _url("batch_changelist"),
        {"action": "retry_failed_members", "_selected_action": [batch.id]},
    )

    assert response.status_code == 302
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        "Retried 2 failed members of 1 batches (2 dead messages retried)."
    ]
    # The plain member is live again; the chain's failed first step is, and its last step
    # waits for it again (not run without it).
    assert where(bad) == "live" and where(first) == "live" and where(last) == "waiting"
    row = Batch.objects.get(id=batch.id)
    assert (row.succeeded, row.failed) == (1, 0)
    assert [e.object_id for e in LogEntry.objects.all()] == [str(batch.id)]
    finish(bad, first)
    finish(last)
    row = Batch.objects.get(id=batch.id)
    assert (row.succeeded, row.failed) == (3, 0) and row.succeeded_at is not None
    assert where(batch.on_success.id) == "live"
    page = staff_client(*COMPOSITION_VIEW).get(_url("batch_change", batch.id)).text
    assert "succeeded" in page


def test_retry_failed_members_needs_the_dead_letters_retry_permission(
    staff_client: StaffClient,
) -> None:
    batch, _, bad, *_ = failed_batch()
    client = staff_client(*COMPOSITION_VIEW)
    assert 'value="retry_failed_members"' not in client.get(_url("batch_changelist")).text
    client.post(
        _url("batch_changelist"),
        {"action": "retry_failed_members", "_selected_action": [batch.id]},
    )
    assert where(bad) == "dead" and Batch.objects.get(id=batch.id).failed == 2
    assert not LogEntry.objects.exists()
    assert staff_client(view=False).get(_url("batch_changelist")).status_code == 403


@pytest.mark.skipif(not CHANGE_FORM_ACTIONS, reason="actions on the change form are Django 6.1's")
def test_the_batch_page_has_a_retry_button(staff_client: StaffClient) -> None:
    batch, _, bad, *_ = failed_batch()
    client = staff_client(*COMPOSITION_VIEW, "retry_deadmessage")
    url = _url("batch_change", batch.id)
    assert "Retry failed members" in client.get(url).text
    response = client.post(
        url,
        {"CHANGE_FORM-action": "retry_failed_members", "_selected_action": batch.id, "index": 0},
    )
    assert response.status_code == 302
    assert where(bad) == "live"


def test_the_waiting_list_shows_what_each_waits_on_and_the_callbacks(
    staff_client: StaffClient,
) -> None:
    first = enqueue("a")
    second = enqueue("a")
    waiter = enqueue("w", after=[first, second])
    batch = enqueue_batch([step("m")], on_complete=step("done"))
    assert batch.on_complete
    client = staff_client(*COMPOSITION_VIEW)
    page = client.get(_url("waitingmessage_changelist"))
    assert page.status_code == 200
    text = page.text
    assert _url("waitingmessage_change", waiter.id) in text
    assert _url("message_change", first.id) in text and _url("message_change", second.id) in text
    assert _url("batch_change", batch.id) in text
    assert text.count('alt="True"') == 1  # the one batch callback
    by_queue = client.get(_url("waitingmessage_changelist"), {"queue": "default"})
    assert by_queue.status_code == 200
    detail = client.get(_url("waitingmessage_change", waiter.id)).text
    assert f"#{first.id}</a> (live)" in detail


def test_cancel_a_waiting_message_buries_it_and_what_waits_on_it(
    staff_client: StaffClient,
) -> None:
    steps = enqueue_chain([step("a"), step("b"), step("c")])
    _, middle, last = steps.ids
    client = staff_client(*COMPOSITION_VIEW)
    forged = {"action": "cancel", "_selected_action": [middle]}
    client.post(_url("waitingmessage_changelist"), forged)
    assert where(middle) == "waiting"

    client = staff_client(*COMPOSITION_VIEW, "cancel_message")
    response = client.post(_url("waitingmessage_changelist"), forged)
    assert response.status_code == 302
    assert DeadMessage.objects.get(message_id=middle).reason == "cancelled"
    assert DeadMessage.objects.get(message_id=last).reason == "dependency_failed"


def test_a_message_page_shows_its_chain_and_batch(staff_client: StaffClient) -> None:
    steps = enqueue_chain([step("a"), step("b"), step("c")])
    first, middle, last = steps.ids
    client = staff_client(*COMPOSITION_VIEW)
    live = client.get(_url("message_change", first)).text
    assert f"#{middle}</a> (waiting)" in live and "Runs before" in live
    waiting = client.get(_url("waitingmessage_change", middle)).text
    assert f"#{first}</a> (live)" in waiting and f"#{last}</a> (waiting)" in waiting
    finish(first)
    archived_pk = ArchivedMessage.objects.get(message_id=first).pk
    archived = client.get(_url("archivedmessage_change", archived_pk)).text
    # A finished message no longer keeps its own dependencies, but its dependents remain.
    assert f"#{middle}</a> (live)" in archived

    batch = enqueue_batch([step("m")], on_success=step("ok"), label="the batch")
    assert batch.on_success
    member = client.get(_url("message_change", batch.member_ids[0])).text
    assert "a member" in member and _url("batch_change", batch.id) in member
    callback = client.get(_url("waitingmessage_change", batch.on_success.id)).text
    assert "its success callback (on_success)" in callback

    plain = enqueue("p")
    assert (
        "no dependencies, dependents or batch" in client.get(_url("message_change", plain.id)).text
    )


def test_a_dependency_failed_message_links_its_cause(staff_client: StaffClient) -> None:
    steps = enqueue_chain([step("a"), step("b")])
    first, second = steps.ids
    bury(first)
    client = staff_client(*COMPOSITION_VIEW)
    page = client.get(_url("deadmessage_change", _dead_pk(second))).text
    assert "Failed dependency" in page
    assert _url("deadmessage_change", _dead_pk(first)) in page
    assert "Retry that one to bring this message back" in page

    batch = enqueue_batch([step("m")], on_success=step("ok"))
    assert batch.on_success
    bury(batch.member_ids[0])
    callback = client.get(_url("deadmessage_change", _dead_pk(batch.on_success.id))).text
    assert _url("batch_change", batch.id) in callback


def test_waiting_rows_are_read_without_loading_the_tables_one_by_one(
    staff_client: StaffClient,
) -> None:
    heads = [enqueue("a") for _ in range(3)]
    for _ in range(20):
        enqueue("w", after=heads)
    client = staff_client(*COMPOSITION_VIEW)
    client.get(_url("waitingmessage_changelist"))
    with CaptureQueriesContext(connection) as queries:
        assert client.get(_url("waitingmessage_changelist")).status_code == 200
    # Session, user, permissions, the count and the page, then four lookups for the page.
    assert len(queries) <= 16
    assert WaitingMessage.objects.count() == 20
