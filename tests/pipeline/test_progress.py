"""Long Spark jobs report how far they are while they run."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from django_pgqueue.pipeline import progress
from django_pgqueue.pipeline.stats import stats

from .conftest import fill_archive

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def test_stats_reports_partitions_done_while_it_reads_and_aggregates(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "WATCH_INTERVAL", 0.05)
    fill_archive(300)
    lines: list[str] = []

    stats(
        spark,
        since=dt.datetime(2026, 10, 1, tzinfo=dt.UTC),
        until=dt.datetime(2026, 10, 2, tzinfo=dt.UTC),
        report=lines.append,
    )

    running = [line for line in lines if "partitions done" in line]
    assert running, lines
    assert lines[-1].endswith("(written)")


def test_a_watch_without_a_report_sets_no_job_group(spark: Any) -> None:
    quiet = progress.Progress("quiet", 1)
    with progress.SparkJobWatch(spark, quiet, "nothing") as watch:
        spark.range(10).count()
    assert watch.tasks() == (0, 0)
