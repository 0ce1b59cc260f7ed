"""Bulk enqueue: text PostgreSQL cannot store is a bad row with its reason, never a COPY
that fails half-way (the rules of ``enqueue()``, core/_validation.py)."""

from __future__ import annotations

from typing import Any

import pytest

from django_pgqueue.exceptions import BadInput
from django_pgqueue.models import Message
from django_pgqueue.pipeline.enqueue import enqueue_frame

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def test_nul_in_a_tenant_or_a_dedup_key_is_a_bad_row(spark: Any) -> None:
    # Spark's own JSON of the row: the rows the vectorized check would pass as sure.
    frame = spark.createDataFrame(
        [(1, "a\x00b", "k1"), (2, "t", "k\x00-2"), (3, "t", "k3")], ["n", "tenant", "key"]
    )
    options: dict[str, Any] = {
        "task": "t",
        "queue": "nul",
        "tenant_column": "tenant",
        "dedup_key_column": "key",
        # Kept in the payload, the NUL would be the payload's error: this test is of the keys.
        "drop_mapped_columns": True,
    }
    with pytest.raises(BadInput):
        enqueue_frame(spark, frame, **options)
    assert Message.objects.count() == 0

    result = enqueue_frame(spark, frame, skip_bad=True, **options)

    assert (result.enqueued, result.bad_count) == (1, 2)
    reasons = dict(result.bad_rows)
    assert "tenant" in reasons[1] and "U+0000" in reasons[1]
    assert "dedup_key" in reasons[2] and "U+0000" in reasons[2]
    assert list(Message.objects.values_list("payload", flat=True)) == [{"n": 3}]


def test_a_lone_surrogate_in_a_json_payload_column_is_a_bad_row(spark: Any) -> None:
    frame = spark.createDataFrame(
        [('{"v": "\\ud800"}',), ('{"v": "\\ud83d\\ude00"}',)], ["payload"]
    )
    result = enqueue_frame(
        spark, frame, task="t", queue="surrogate", payload_column="payload", skip_bad=True
    )
    assert (result.enqueued, result.bad_count) == (1, 1)
    assert "surrogate" in result.bad_rows[0][1]
    assert list(Message.objects.values_list("payload", flat=True)) == [{"v": "\U0001f600"}]
