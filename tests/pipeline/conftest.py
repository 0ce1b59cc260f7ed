"""One real local SparkSession for every pipeline test (starting one costs ~5 s)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("TZ", "UTC")


def _spark_missing() -> str | None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install -e '.[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime"
    from django_pgqueue.pipeline.session import DEFAULT_JDBC_JAR, JDBC_JAR_ENV

    if not Path(os.environ.get(JDBC_JAR_ENV, DEFAULT_JDBC_JAR)).is_file():
        return "no PostgreSQL JDBC jar (apt-get install libpostgresql-jdbc-java)"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    missing = _spark_missing()
    if missing:
        pytest.skip(missing)
    from django_pgqueue.pipeline.session import build_session

    session = build_session("local[2]", app_name="pgq-pipeline-tests", testing=True)
    yield session
    session.stop()


def run_sql(statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])
        return list(cursor.fetchall()) if cursor.description else []


def fill_archive(rows: int, *, start_day: str = "2026-10-01", queues: int = 3) -> None:
    """``rows`` committed archive rows over several queues, days and tasks, some failed once."""
    run_sql(
        """
        INSERT INTO pgqueue_archive
            (message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at,
             attempts, max_attempts, errors, started_at, finished_at, worker_id, result)
        SELECT (SELECT coalesce(max(message_id), 10000000) FROM pgqueue_archive) + i, 'q' || (i %% %s), 'tasks.t' || (i %% 4),
               jsonb_build_object('n', i, 'name', 'é✓ ' || md5(i::text), 'tags', jsonb_build_array(i, null)),
               (i %% 7) - 3,
               CASE WHEN i %% 5 = 0 THEN NULL ELSE 't' || (i %% 3) END,
               CASE WHEN i %% 2 = 0 THEN 'k' || i END,
               ts, 1 + (i %% 3 = 0)::int, 3,
               CASE WHEN i %% 3 = 0 THEN jsonb_build_array(jsonb_build_object(
                   'attempt', 1, 'type', 'ValueError', 'message', 'bad row ' || i))
                    ELSE '[]'::jsonb END,
               ts + make_interval(secs => (i %% 11) * 0.25),
               ts + make_interval(secs => (i %% 11) * 0.25 + (i %% 13) * 0.1),
               'w1', CASE WHEN i %% 4 = 0 THEN NULL ELSE jsonb_build_object('ok', true) END
        FROM generate_series(1, %s) AS i,
             LATERAL (SELECT %s::timestamptz + i * interval '97 seconds') AS t(ts)
        """,
        [queues, rows, start_day],
    )


def fill_dead(rows: int, *, start_day: str = "2026-10-01") -> None:
    run_sql(
        """
        INSERT INTO pgqueue_dead
            (message_id, queue, task, payload, enqueued_at, attempts, max_attempts, errors,
             reason, details, worker_id, died_at)
        SELECT (SELECT coalesce(max(message_id), 20000000) FROM pgqueue_dead) + i, 'q' || (i %% 2), 'tasks.t' || (i %% 2), jsonb_build_object('n', i),
               ts, 3, 3,
               jsonb_build_array(
                   jsonb_build_object('attempt', 1, 'type', 'KeyError', 'message', 'missing ' || i),
                   jsonb_build_object('attempt', 2, 'type', 'KeyError', 'message', 'missing ' || i),
                   jsonb_build_object('attempt', 3, 'type', 'TimeoutError', 'message', 'took 30s')),
               (ARRAY['error', 'timeout', 'rejected'])[1 + i %% 3],
               jsonb_build_object('type', 'KeyError', 'message', 'missing ' || i),
               'w2', ts + interval '40 seconds'
        FROM generate_series(1, %s) AS i,
             LATERAL (SELECT %s::timestamptz + i * interval '331 seconds') AS t(ts)
        """,
        [rows, start_day],
    )


def committed_files(destination: str, source: str = "archive") -> list[str]:
    """Local paths of the data files of the latest version of the source's Delta table."""
    from deltalake import DeltaTable

    from django_pgqueue.pipeline.committed import table_uri

    uri = table_uri(destination, source)
    if not DeltaTable.is_deltatable(uri):
        return []
    return [f.removeprefix("file://") for f in DeltaTable(uri).file_uris()]


def committed_ids_arrow(destination: str, source: str = "archive") -> list[int]:
    """The ids of the latest version of the source's table, read by deltalake (no Spark)."""
    from deltalake import DeltaTable

    from django_pgqueue.pipeline.committed import table_uri

    table = DeltaTable(table_uri(destination, source)).to_pyarrow_table(columns=["id"])
    return sorted(table["id"].to_pylist())
