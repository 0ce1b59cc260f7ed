from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from django_pgqueue.exceptions import NoVerifiedExport
from django_pgqueue.models import ArchivedMessage, DeadMessage
from django_pgqueue.pipeline.export import export
from django_pgqueue.pipeline.models import ExportRange
from django_pgqueue.pipeline.prune import prune

from .conftest import fill_archive, fill_dead, run_sql

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def test_prune_refuses_without_a_verified_export() -> None:
    fill_archive(20)
    with pytest.raises(NoVerifiedExport, match="Run `pgq_pipeline export` first"):
        prune(destination="/nonexistent/export")
    assert ArchivedMessage.objects.count() == 20


def test_prune_deletes_exactly_the_verified_rows_and_nothing_newer(
    spark: Any, tmp_path: Path
) -> None:
    fill_archive(900)
    fill_dead(100)
    destination = str(tmp_path / "out")
    export(spark, destination, range_size=250)
    exported_archive = set(ArchivedMessage.objects.values_list("id", flat=True))
    fill_archive(50, start_day="2026-11-05")  # committed after the export: not verified
    fill_dead(5, start_day="2026-11-05")
    newer = set(ArchivedMessage.objects.values_list("id", flat=True)) - exported_archive
    tampered = ArchivedMessage.objects.order_by("id")[10]  # changed after it was exported
    ArchivedMessage.objects.filter(pk=tampered.pk).update(result={"changed": True})
    tampered_range = ExportRange.objects.get(
        source="archive", lo__lte=tampered.pk, hi__gt=tampered.pk
    )

    result = prune(destination=destination)

    in_tampered_range = {i for i in exported_archive if tampered_range.lo <= i < tampered_range.hi}
    assert set(ArchivedMessage.objects.values_list("id", flat=True)) == newer | in_tampered_range
    assert DeadMessage.objects.count() == 5
    assert result.rows == len(exported_archive) - len(in_tampered_range) + 100
    assert result.row_bytes > 0
    assert len(result.skipped) == 1 and "re-run export" in result.skipped[0]
    tampered_range.refresh_from_db()
    assert tampered_range.status == "mismatch"
    assert ExportRange.objects.filter(status="pruned").count() == result.ranges_pruned
    # The next export re-exports the changed range; then it can be pruned too.
    export(spark, destination, range_size=250)
    again = prune(destination=destination, sources=["archive"])
    assert again.skipped == [] and again.rows == len(in_tampered_range) + len(newer)
    assert not ArchivedMessage.objects.exists()


def test_prune_keeps_the_last_days(spark: Any, tmp_path: Path) -> None:
    fill_archive(400, start_day="2026-01-01")
    recent_start = (timezone.now() - dt.timedelta(hours=2)).isoformat()
    fill_archive(30, start_day=recent_start)
    export(spark, str(tmp_path / "out"), sources=["archive"], range_size=100)
    cutoff = timezone.now() - dt.timedelta(days=3)

    result = prune(destination=str(tmp_path / "out"), keep_days=3, vacuum=True)

    kept_ranges = ExportRange.objects.filter(status="verified")
    assert kept_ranges.exists() and all(r.max_at >= cutoff for r in kept_ranges)
    remaining = run_sql("SELECT count(*) FROM pgqueue_archive WHERE finished_at >= %s", [cutoff])
    assert remaining[0][0] == 30  # every recent row kept
    expected_left = sum(r.source_rows for r in kept_ranges)
    assert ArchivedMessage.objects.count() == expected_left
    assert result.rows == 430 - expected_left and result.vacuumed
