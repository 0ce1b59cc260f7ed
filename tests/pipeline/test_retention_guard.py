"""The pipeline's retention guard: with a destination configured, retention never expires a
row that destination's export does not hold yet (real Spark export, real partitions)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_pgqueue.core import _retention
from django_pgqueue.models import ArchivedMessage, DeadMessage
from django_pgqueue.pipeline import retention_guard
from django_pgqueue.pipeline.export import RECHECK_RANGES, export
from django_pgqueue.pipeline.models import ExportRange
from django_pgqueue.pipeline.prune import prune
from tests.core.test_retention import (  # noqa: F401 (fixture)
    _only_current_days,
    archive,
    db_now,
    exists,
    noon,
    old_day,
)
from tests.factories import DeadMessageFactory

from .conftest import committed_ids_arrow

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

WEEK = {"ARCHIVE_RETENTION": 7 * 86400.0, "DEAD_RETENTION": 7 * 86400.0}


def test_the_guard_is_registered_and_inert_without_a_destination() -> None:
    assert retention_guard.guard in _retention._GUARDS
    assert retention_guard.guard("archive", "default") is None


def test_retention_keeps_what_the_destination_does_not_hold(spark: Any, tmp_path: Path) -> None:
    destination = str(tmp_path / "out")
    oldest, older, old = old_day(13), old_day(12), old_day(11)
    oldest_ids = archive(300, noon(oldest))
    older_ids = archive(300, noon(older))
    export(spark, destination, sources=["archive"], range_size=50)
    old_ids = archive(100, noon(old))  # not exported
    today_ids = archive(20, db_now())
    dead = DeadMessageFactory.create_batch(3, died_at=db_now() - dt.timedelta(days=9))
    pipeline = {retention_guard.KEY: [destination + "/"]}

    with override_settings(PGQUEUE=WEEK, PGQUEUE_PIPELINE=pipeline):
        bound = retention_guard.guard("archive", "default")
        first = _retention.run_retention()

    # The newest verified ranges stay: the next export re-checks them against the database.
    newest = ExportRange.objects.filter(status="verified").order_by("-lo")[:RECHECK_RANGES]
    assert bound == min(r.lo for r in newest)
    assert not exists(oldest.name) and exists(older.name) and exists(old.name)
    assert not ArchivedMessage.objects.filter(id__in=oldest_ids).exists()
    remaining = set(ArchivedMessage.objects.values_list("id", flat=True))
    assert remaining == set(older_ids + old_ids + today_ids)
    kept = [s.target for s in first.steps if s.action == "keep"]
    assert kept == [f"day {older.name}", f"day {old.name}"]
    # Dead letters were never exported to it: all kept.
    assert DeadMessage.objects.count() == len(dead)

    # The export catches up (what it re-checks is still there), and the next run drops the
    # day it now holds, never the unexported rows of today.
    result = export(spark, destination, sources=["archive"], range_size=50)
    assert result.mismatched == []
    with override_settings(PGQUEUE=WEEK, PGQUEUE_PIPELINE=pipeline):
        _retention.run_retention()
    assert not exists(older.name) and exists(old.name)
    assert set(ArchivedMessage.objects.values_list("id", flat=True)) == set(old_ids + today_ids)

    # The ranges whose rows retention expired are pruned, not "changed": nothing exports them
    # again, prune has nothing to refuse, and the files still hold every row.
    expired = set(oldest_ids + older_ids)
    touched = ExportRange.objects.filter(lo__lte=max(expired), hi__gt=min(expired))
    assert {r.status for r in touched} == {"pruned"}
    assert export(spark, destination, sources=["archive"], range_size=50).mismatched == []
    assert prune(destination=destination, sources=["archive"]).skipped == []
    assert committed_ids_arrow(destination) == sorted(oldest_ids + older_ids + old_ids + today_ids)


def test_a_malformed_setting_is_reported() -> None:
    with override_settings(PGQUEUE_PIPELINE={retention_guard.KEY: "/one/path"}):
        with pytest.raises(Exception, match="must be a list of export destinations"):
            retention_guard.guard("archive", "default")
