from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

import django_pgqueue
from django_pgqueue.exceptions import BadInput, PipelineError
from django_pgqueue.models import ArchivedMessage, Message
from django_pgqueue.pipeline import cli, session
from django_pgqueue.pipeline.enqueue import enqueue_frame
from django_pgqueue.pipeline.models import BulkEnqueueVote
from tests.conftest import drain
from tests.dsn import database_url
from tests.factories import ArchivedMessageFactory

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

REPO = Path(settings.REPO_DIR)
WORKER_COMMAND = REPO / "django_pgqueue" / "management" / "commands" / "pgq_worker.py"


def run_worker(queue: str) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings"),
        "DATABASE_URL": database_url(),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "example_project"), *sys.path]),
    }
    command = [sys.executable, "-m", "django", "pgq_worker", "--burst", "--no-listen"]
    command += ["--queue", queue, "--concurrency", "4", "--batch-size", "500"]
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(not WORKER_COMMAND.exists(), reason="pgq_worker is not there yet")
def test_bulk_enqueue_of_20k_rows_is_processed_by_the_worker(
    spark: Any, listener: psycopg.Connection[Any]
) -> None:
    from pyspark.sql import functions as F

    frame = (
        spark.range(20_000, numPartitions=4)
        .withColumn("user", F.concat(F.lit("u"), F.col("id").cast("string")))
        .withColumn("amount", F.col("id") * 0.5)
    )

    first = enqueue_frame(spark, frame, task="bench.noop", queue="bulk", batch_id="b1")

    assert (first.rows, first.enqueued, first.bad_count, first.partitions) == (
        20_000,
        20_000,
        0,
        4,
    )
    assert Message.objects.filter(queue="bulk", task="bench.noop").count() == 20_000
    message = Message.objects.get(queue="bulk", payload__id=41)
    assert message.payload == {"id": 41, "user": "u41", "amount": 20.5}
    assert message.dedup_key.startswith("b1:") and len(message.dedup_key) == 3 + 32
    # One wake-up per partition, not per row.
    assert drain(listener) == [("django_pgqueue", "bulk")] * 4
    # A retried job (same batch id) enqueues nothing twice while the messages are live...
    again = enqueue_frame(spark, frame, task="bench.noop", queue="bulk", batch_id="b1")
    assert (again.enqueued, again.duplicates) == (0, 20_000)

    run_worker("bulk")

    assert not Message.objects.filter(queue="bulk").exists()
    assert ArchivedMessage.objects.filter(queue="bulk").count() == 20_000
    # ...nor after the worker finished them: keys are checked against the archive too.
    late = enqueue_frame(spark, frame, task="bench.noop", queue="bulk", batch_id="b1")
    assert late.enqueued == 0 and not Message.objects.exists()


def test_bad_csv_rows_are_reported_and_nothing_is_enqueued(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "orders.csv"
    path.write_text(
        "order,prio\n"
        "1,5\n"
        '2,"500"\n'  # priority out of range
        "3,1,extra,fields\n"  # malformed: too many fields
        "4,x\n"  # priority not a number
        "5,0\n"
    )
    with pytest.raises(BadInput) as caught:
        enqueue_frame(spark, str(path), task="tests.echo", queue="csv", priority_column="prio")
    assert caught.value.bad_count == 3
    assert [n for n, _ in caught.value.bad_rows] == [2, 3, 4]
    assert "priority" in caught.value.bad_rows[0][1]
    assert "malformed record" in caught.value.bad_rows[1][1]
    assert not Message.objects.exists()

    result = enqueue_frame(
        spark, str(path), task="tests.echo", queue="csv", priority_column="prio", skip_bad=True
    )

    assert (result.enqueued, result.bad_count) == (2, 3)
    assert sorted(
        (m.payload["order"], m.priority) for m in Message.objects.filter(queue="csv")
    ) == [("1", 5), ("5", 0)]


def test_malformed_json_lines_and_bad_payloads_are_reported(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(
        '{"event": "a", "key": "k1"}\n'
        '{"event": "b", "key": \n'  # malformed
        '{"event": "c\\u0000", "key": "k3"}\n'  # NUL: jsonb cannot store it
        '{"event": "d", "key": "k1"}\n'  # same dedup key as the first row
    )
    with pytest.raises(BadInput, match="2 of 4 input rows are invalid"):
        enqueue_frame(spark, str(path), task="tests.echo", queue="json", dedup_key_column="key")

    result = enqueue_frame(
        spark,
        str(path),
        task="tests.echo",
        queue="json",
        dedup_key_column="key",
        skip_bad=True,
    )

    assert (result.enqueued, result.duplicates, result.bad_count) == (1, 1, 2)
    message = Message.objects.get(queue="json")
    assert (message.dedup_key, message.payload) == ("k1", {"event": "a", "key": "k1"})


def test_payload_column_and_archived_keys(spark: Any) -> None:
    ArchivedMessageFactory(queue="pc", dedup_key="done-1")
    frame = spark.createDataFrame(
        [("done-1", '{"a": 1}'), ("new-2", '{"b": [1, 2]}'), ("bad-3", "{not json")],
        ["key", "body"],
    )
    with pytest.raises(BadInput, match="row 3: payload is not valid JSON"):
        enqueue_frame(
            spark, frame, task="t", queue="pc", payload_column="body", dedup_key_column="key"
        )
    result = enqueue_frame(
        spark,
        frame,
        task="t",
        queue="pc",
        payload_column="body",
        dedup_key_column="key",
        skip_bad=True,
    )
    assert result.enqueued == 1
    assert list(Message.objects.values_list("dedup_key", "payload")) == [("new-2", {"b": [1, 2]})]


def test_bad_arguments_are_refused_before_any_work(spark: Any, tmp_path: Path) -> None:
    frame = spark.range(3)
    with pytest.raises(Exception, match="Invalid queue name"):
        enqueue_frame(spark, frame, task="t", queue="Not Valid")
    with pytest.raises(PipelineError, match="not in the input"):
        enqueue_frame(spark, frame, task="t", queue="q", dedup_key_column="missing")
    with pytest.raises(PipelineError, match="does not exist"):
        enqueue_frame(spark, str(tmp_path / "nowhere.parquet"), task="t", queue="q")
    (tmp_path / "empty.parquet").mkdir()
    with pytest.raises(PipelineError, match="Cannot read"):
        enqueue_frame(spark, str(tmp_path / "empty.parquet"), task="t", queue="q")
    assert not Message.objects.exists()


def test_rows_in_doubt_get_the_row_by_row_check(spark: Any) -> None:
    # The vectorized check passes only rows it is sure of; the others (NaN, text that looks
    # like NaN, odd priority spellings, a too-long tenant) are decided by check_row. Spark's
    # to_json writes a NaN double as the string "NaN", which is valid JSON.
    frame = spark.createDataFrame(
        [
            (1, 0.5, "plain", " 7", "t1"),
            (2, float("nan"), "nan score", "1", "t1"),
            (3, 1.0, "NaN and Infinity are fine in text", "+5", None),
            (4, 2.0, "long tenant", "0", "t" * 256),
            (5, 3.0, "priority 101", "101", None),
        ],
        ["n", "score", "note", "prio", "tenant"],
    )

    result = enqueue_frame(
        spark,
        frame,
        task="t",
        queue="doubt",
        priority_column="prio",
        tenant_column="tenant",
        skip_bad=True,
    )

    assert (result.rows, result.enqueued, result.bad_count) == (5, 3, 2)
    assert [n for n, _ in result.bad_rows] == [4, 5]
    assert "tenant" in result.bad_rows[0][1] and "priority" in result.bad_rows[1][1]
    assert sorted(
        (m.payload["n"], m.payload["score"], m.priority, m.tenant, m.payload["note"])
        for m in Message.objects.filter(queue="doubt")
    ) == [
        (1, 0.5, 7, "t1", "plain"),
        (2, "NaN", 1, "t1", "nan score"),
        (3, 1.0, 5, None, "NaN and Infinity are fine in text"),
    ]


@pytest.mark.parametrize("partitions", [2, 5])
def test_one_bad_row_in_any_partition_stops_every_partition(spark: Any, partitions: int) -> None:
    """All-or-nothing across partitions: in one barrier pass when the partitions fit the
    task slots at once (local[2]: 2), in a validating pass then a writing pass when not."""
    from django_pgqueue.pipeline.enqueue import _fits_one_barrier_stage

    rows = [(n, 5) for n in range(1, 100)] + [(100, 500)]  # the last row's priority is bad
    frame = spark.createDataFrame(rows, "n long, prio long").repartition(partitions, "n")
    assert _fits_one_barrier_stage(spark, frame.rdd.getNumPartitions()) is (partitions <= 2)

    with pytest.raises(BadInput) as caught:
        enqueue_frame(spark, frame, task="tests.echo", queue="parts", priority_column="prio")
    assert caught.value.bad_count == 1 and "priority" in caught.value.bad_rows[0][1]
    assert not Message.objects.exists()

    good = frame.where("n < 100")
    result = enqueue_frame(spark, good, task="tests.echo", queue="parts", priority_column="prio")
    assert (result.enqueued, result.rows, result.bad_count) == (99, 99, 0)
    assert Message.objects.filter(queue="parts").count() == 99
    again = enqueue_frame(
        spark, good, task="tests.echo", queue="parts", priority_column="prio",
        batch_id=result.batch_id,
    )  # fmt: skip
    assert (again.enqueued, again.duplicates) == (0, 99)
    assert not BulkEnqueueVote.objects.exists()  # each call removes its partitions' votes


def test_bulk_enqueue_into_a_fair_queue_takes_turns_with_other_tenants(spark: Any) -> None:
    """Rows go in outside the fair order (fair_order -1); the first claims place them, each
    tenant behind its own waiting messages. A live key takes the row-by-row path: same."""
    fair = {"QUEUES": {"fq": {"FAIRNESS": True}}}
    with override_settings(PGQUEUE=fair):
        django_pgqueue.enqueue("t", {"n": -1}, queue="fq", tenant="heavy", dedup_key="dup")
        rows = [(f"h{n}", "heavy", n) for n in range(30)] + [("dup", "heavy", 99)]
        rows += [(f"l{n}", "light", n) for n in range(2)]
        frame = spark.createDataFrame(rows, ["key", "tenant", "n"])
        result = enqueue_frame(
            spark, frame, task="t", queue="fq", dedup_key_column="key", tenant_column="tenant"
        )
        assert result.enqueued == 32
        assert Message.objects.filter(queue="fq", fair_order=-1).count() == 32
        first = Message.objects.lease("fq", worker_id="w", batch_size=4)
    assert sorted(m.tenant for m in first) == ["heavy", "heavy", "light", "light"]


def test_generated_keys_do_not_depend_on_partitioning(spark: Any, tmp_path: Path) -> None:
    """The same input and batch id read as 1 then 3 partitions (as local[1] then local[3]
    split it) adds nothing the second time: keys come from the rows, not their positions."""
    path = tmp_path / "signups.csv"
    path.write_text("email,plan\n" + "".join(f"u{n}@example.com,p{n % 3}\n" for n in range(60)))
    frame = spark.read.option("header", "true").csv(str(path))

    first = enqueue_frame(spark, frame.coalesce(1), task="t", queue="split", batch_id="b")
    again = enqueue_frame(spark, frame.repartition(3), task="t", queue="split", batch_id="b")

    assert (first.partitions, first.enqueued) == (1, 60)
    assert (again.partitions, again.enqueued, again.duplicates) == (3, 0, 60)
    assert Message.objects.filter(queue="split").count() == 60


def test_rfc4180_csv_with_doubled_quotes_and_quoted_line_breaks(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "notes.csv"
    path.write_bytes(
        b'id,note\r\n1,"She said ""hi"""\r\n2,"two\r\nlines, and a comma"\r\n3,plain\r\n'
    )

    result = enqueue_frame(spark, str(path), task="t", queue="rfc")

    assert (result.rows, result.enqueued, result.bad_count) == (3, 3, 0)
    assert sorted(
        (m.payload["id"], m.payload["note"]) for m in Message.objects.filter(queue="rfc")
    ) == [("1", 'She said "hi"'), ("2", "two\nlines, and a comma"), ("3", "plain")]


def test_skip_bad_with_no_valid_row_fails_and_says_how_many(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "prios.csv"
    path.write_text("n,prio\n1,500\n2,x\n")
    with pytest.raises(BadInput, match="all 2 input rows are invalid") as caught:
        enqueue_frame(
            spark, str(path), task="t", queue="skip", priority_column="prio", skip_bad=True
        )
    assert caught.value.bad_count == 2

    path.write_text("n,prio\n1,500\n2,x\n3,1\n")
    out, err = io.StringIO(), io.StringIO()
    status = cli.run(
        {
            "job": "enqueue", "master": "local[2]", "path": str(path), "task": "t",
            "queue": "skip", "priority_column": "prio", "skip_bad": True,
        },
        out, err,
    )  # fmt: skip
    assert status == 0, err.getvalue()
    assert "warning: skipped 2 invalid rows" in err.getvalue()
    assert "enqueued 1 of 3 rows" in out.getvalue()


def test_key_and_tenant_columns_stay_in_the_payload(spark: Any) -> None:
    frame = spark.createDataFrame([(7, "acme", "a@example.com")], ["user_id", "org", "email"])
    kept = {"user_id": 7, "org": "acme", "email": "a@example.com"}

    enqueue_frame(
        spark, frame, task="t", queue="keep", dedup_key_column="user_id", tenant_column="org"
    )
    enqueue_frame(
        spark, frame, task="t", queue="drop", dedup_key_column="user_id",
        tenant_column="org", drop_mapped_columns=True,
    )  # fmt: skip

    message = Message.objects.get(queue="keep")
    assert (message.payload, message.dedup_key, message.tenant) == (kept, "7", "acme")
    assert Message.objects.get(queue="drop").payload == {"email": "a@example.com"}


def test_bad_arguments_are_refused_before_spark_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_spark(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Spark started")

    monkeypatch.setattr(session, "build_session", no_spark)
    existing = tmp_path / "in.csv"
    existing.write_text("a\n1\n")
    cases = [
        ({"queue": "Not Valid"}, "Invalid queue name"),
        ({"priority": 500}, "priority"),
        ({"batch_id": "a:b"}, "batch_id"),
        ({"path": str(tmp_path / "missing.csv")}, "does not exist"),
    ]
    for extra, reason in cases:
        err = io.StringIO()
        options = {"job": "enqueue", "path": str(existing), "task": "t", **extra}
        assert cli.run(options, io.StringIO(), err) == 2
        assert err.getvalue().count("\n") == 1 and reason in err.getvalue(), err.getvalue()
    err = io.StringIO()
    options = {"job": "enqueue", "path": str(existing), "task": "t", "spark_conf": ["oops"]}
    assert cli.run(options, io.StringIO(), err) == 2
    assert "KEY=VALUE" in err.getvalue() and "oops" not in err.getvalue()


def test_enqueue_reports_progress_while_it_runs(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line before anything is written, and the running job's partitions as they finish."""
    from django_pgqueue.pipeline import progress

    monkeypatch.setattr(progress, "WATCH_INTERVAL", 0.05)
    lines: list[tuple[str, int | None]] = []

    def report(line: str) -> None:
        on_main = threading.current_thread() is threading.main_thread()
        lines.append((line, Message.objects.count() if on_main else None))

    frame = spark.range(2000, numPartitions=4)
    enqueue_frame(spark, frame, task="t", queue="progress", report=report)

    assert lines[0][1] == 0, lines  # said before any row was written
    assert "4 partitions" in lines[0][0]
    assert any("partitions done" in line for line, _ in lines), lines
    assert "2/2 passes done" in lines[-1][0]


def test_live_key_fallback_needs_no_temp_privilege() -> None:
    """When the COPY meets a live key, the partition goes in with ON CONFLICT DO NOTHING, as
    a role without the TEMP privilege on the database."""
    import pyarrow as pa

    from django_pgqueue.pipeline.bulkrows import BulkJob, write_partition
    from django_pgqueue.pipeline.session import psycopg_dsn

    django_pgqueue.enqueue("t", {"n": 0}, queue="notemp", dedup_key="k0")
    name = connection.settings_dict["NAME"]
    role = f"pgq_notemp_{name}"[:63]
    with connection.cursor() as cursor:
        cursor.execute(f'DROP ROLE IF EXISTS "{role}"')
        cursor.execute(f'CREATE ROLE "{role}" LOGIN')
        cursor.execute(f'REVOKE TEMP ON DATABASE "{name}" FROM PUBLIC')
        cursor.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"')
        cursor.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
    try:
        job = BulkJob(
            dsn=psycopg_dsn() + f" user={role}", queue="notemp", task="t", max_attempts=3,
            batch_id="b", default_priority=0, max_bytes=1 << 20, trusted_json=True,
            wrapped=False, check_history=False, notify_channel=None,
            history_tables=(),
        )  # fmt: skip
        rows = pa.table(
            {
                "payload": ['{"n": 0}', '{"n": 1}'],
                "dedup_key": ["k0", "k1"],
                "priority": pa.array([0, 0], pa.int16()),
                "tenant": pa.array([None, None], pa.string()),
            }
        )
        with psycopg.connect(job.dsn) as conn:
            assert not conn.execute(
                "SELECT has_database_privilege(current_user, current_database(), 'TEMP')"
            ).fetchone()[0]
            assert write_partition(job, conn, rows) == 1
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'GRANT TEMP ON DATABASE "{name}" TO PUBLIC')
            cursor.execute(f'DROP OWNED BY "{role}"')
            cursor.execute(f'DROP ROLE "{role}"')
    assert sorted(Message.objects.filter(queue="notemp").values_list("dedup_key", flat=True)) == [
        "k0",
        "k1",
    ]


def test_identical_rows_in_two_partitions_are_one_message_in_one_pass(spark: Any) -> None:
    """Partitions write before they vote (uncommitted); one meeting the other's uncommitted
    key gives up its COPY at once and skips the key after the vote, instead of waiting for a
    partition that is waiting for it."""
    frame = spark.createDataFrame([(n % 50,) for n in range(100)], "n long").repartition(2)

    result = enqueue_frame(spark, frame, task="t", queue="twins")

    assert (result.rows, result.enqueued, result.duplicates) == (100, 50, 50)
    assert sorted(m.payload["n"] for m in Message.objects.filter(queue="twins")) == list(range(50))
