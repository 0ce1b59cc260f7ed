"""Completed batches go with the archive's retention; open ones stay whatever their age."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings

from django_pgqueue import enqueue_batch, step
from django_pgqueue.core._retention import run_retention
from django_pgqueue.models import Batch, BatchMember

from .helpers import finish

pytestmark = pytest.mark.django_db(transaction=True)


@override_settings(PGQUEUE={"ARCHIVE_RETENTION": 3600})
def test_batches_completed_before_the_archive_retention_are_deleted_with_their_members() -> None:
    old = enqueue_batch([step("m")], on_complete=step("done"))
    finish(*old.member_ids)
    open_batch = enqueue_batch([step("m")])
    recent = enqueue_batch([], on_complete=step("done"))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_batch SET completed_at = now() - interval '2 hours',"
            " created_at = now() - interval '3 hours' WHERE id = ANY(%s)",
            [[old.id]],
        )
        cursor.execute(
            "UPDATE pgqueue_batch SET created_at = now() - interval '3 hours' WHERE id = %s",
            [open_batch.id],
        )
    report = run_retention()
    assert report.problems == []
    assert set(Batch.objects.values_list("id", flat=True)) == {open_batch.id, recent.id}
    assert not BatchMember.objects.filter(batch_id=old.id).exists()
