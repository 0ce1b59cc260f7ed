from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from django_pgqueue.pipeline.models import QueueStatsHourly
from django_pgqueue.pipeline.stats import stats

from .conftest import fill_archive, fill_dead, run_sql

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

SINCE = dt.datetime(2026, 10, 1, tzinfo=dt.UTC)
UNTIL = dt.datetime(2026, 10, 3, tzinfo=dt.UTC)

# The same figures, computed by PostgreSQL alone.
ARCHIVE_SQL = """
SELECT queue, task, date_trunc('hour', finished_at) AS hour, count(*),
       sum(jsonb_array_length(errors)),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
           (ORDER BY extract(epoch FROM started_at - enqueued_at)),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
           (ORDER BY extract(epoch FROM finished_at - started_at))
FROM pgqueue_archive WHERE finished_at >= %s AND finished_at < %s GROUP BY 1, 2, 3
"""
DEAD_SQL = """
SELECT queue, task, date_trunc('hour', died_at), reason, count(*), sum(jsonb_array_length(errors))
FROM pgqueue_dead WHERE died_at >= %s AND died_at < %s GROUP BY 1, 2, 3, 4
"""
ATTEMPTS_SQL = """
SELECT queue, task, hour, attempts, count(*) FROM (
    SELECT queue, task, date_trunc('hour', finished_at) AS hour, attempts FROM pgqueue_archive
    WHERE finished_at >= %s AND finished_at < %s
    UNION ALL
    SELECT queue, task, date_trunc('hour', died_at), attempts FROM pgqueue_dead
    WHERE died_at >= %s AND died_at < %s) AS t GROUP BY 1, 2, 3, 4
"""
ERRORS_SQL = """
SELECT queue, task, hour, sig, count(*) FROM (
    SELECT queue, task, date_trunc('hour', finished_at) AS hour, errors FROM pgqueue_archive
    WHERE finished_at >= %s AND finished_at < %s
    UNION ALL
    SELECT queue, task, date_trunc('hour', died_at), errors FROM pgqueue_dead
    WHERE died_at >= %s AND died_at < %s) AS t,
    LATERAL (SELECT (e->>'type') || ': ' || regexp_replace(e->>'message', '[0-9]+', 'N', 'g')
             FROM jsonb_array_elements(t.errors) AS e) AS s(sig)
GROUP BY 1, 2, 3, 4
"""


def test_stats_match_the_same_figures_computed_in_sql(spark: Any) -> None:
    fill_archive(3_000)  # ~3.4 days at 97 s apart
    fill_dead(200)
    QueueStatsHourly.objects.create(queue="q0", task="stale", hour=SINCE, processed=99)
    outside = QueueStatsHourly.objects.create(queue="q0", task="kept", hour=UNTIL, processed=7)

    result = stats(spark, since=SINCE, until=UNTIL)

    window = [SINCE, UNTIL]
    stored = {(s.queue, s.task, s.hour): s for s in QueueStatsHourly.objects.exclude(pk=outside.pk)}
    expected_groups: set[tuple[str, str, dt.datetime]] = set()
    for queue, task, hour, count, _failed, wait, run in run_sql(ARCHIVE_SQL, window):
        stat = stored[(queue, task, hour)]
        expected_groups.add((queue, task, hour))
        assert stat.processed == count
        assert [stat.wait_p50, stat.wait_p95, stat.wait_p99] == pytest.approx(
            [float(x) for x in wait], abs=1e-6
        )
        assert [stat.run_p50, stat.run_p95, stat.run_p99] == pytest.approx(
            [float(x) for x in run], abs=1e-6
        )
    failed_by_group: dict[tuple[str, str, dt.datetime], int] = {
        g: int(row[4]) for row in run_sql(ARCHIVE_SQL, window) for g in [tuple(row[:3])]
    }
    dead_by_group: dict[tuple[str, str, dt.datetime], dict[str, int]] = {}
    for queue, task, hour, reason, count, failed in run_sql(DEAD_SQL, window):
        group = (queue, task, hour)
        expected_groups.add(group)
        dead_by_group.setdefault(group, {})[reason] = count
        failed_by_group[group] = failed_by_group.get(group, 0) + int(failed)
    assert set(stored) == expected_groups
    assert result.groups == len(expected_groups)
    for group, stat in stored.items():
        assert stat.failed == failed_by_group[group]
        assert stat.dead_by_reason == dead_by_group.get(group, {})
        assert stat.dead == sum(dead_by_group.get(group, {}).values())
    histograms: dict[Any, dict[str, int]] = {}
    for queue, task, hour, attempts, count in run_sql(ATTEMPTS_SQL, window * 2):
        histograms.setdefault((queue, task, hour), {})[str(attempts)] = count
    assert {g: s.attempts_histogram for g, s in stored.items()} == histograms
    signatures: dict[Any, list[tuple[int, str]]] = {}
    for queue, task, hour, sig, count in run_sql(ERRORS_SQL, window * 2):
        signatures.setdefault((queue, task, hour), []).append((-count, sig))
    for group, stat in stored.items():
        top = sorted(signatures.get(group, []))[:5]
        assert stat.top_errors == [{"signature": s, "count": -c} for c, s in top]
    # The window's old rows were replaced; rows outside it were kept.
    assert not QueueStatsHourly.objects.filter(task="stale").exists()
    assert QueueStatsHourly.objects.filter(pk=outside.pk, processed=7).exists()


def test_stats_of_an_empty_window_writes_nothing(spark: Any) -> None:
    result = stats(spark, since=SINCE, until=UNTIL)
    assert result.groups == 0 and result.rows_read == 0
    assert not QueueStatsHourly.objects.exists()
