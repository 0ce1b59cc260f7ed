"""enqueue: bulk-enqueue a DataFrame, or a Parquet / CSV / JSON path, as messages.

How a row becomes a message, in order:

1. every row is validated by the same functions :func:`django_pgqueue.enqueue` uses
   (``encode_payload``, ``validate_optional_key``, ``validate_priority``), in Spark's Python
   workers; each row gets a dedup key: its own column's value, or ``<batch_id>:<partition>:<row>``;
2. with any bad row and ``skip_bad=False`` (the default) NOTHING is written and
   :class:`BadInput` lists the bad rows; with ``skip_bad=True`` the good rows are enqueued and
   the bad ones reported in the result;
3. good rows go through Spark's JDBC writer into an UNLOGGED staging table (a retried Spark
   task may write its partition twice there: harmless, see 5);
4. keys already in the archive or the dead letters of that queue are dropped (live dedup keys
   only guard live messages: without this, a job retried after workers finished part of its
   messages would enqueue those again);
5. the driver moves each partition into the live table in its own short transaction,
   ``INSERT ... ON CONFLICT (queue, dedup_key) DO NOTHING`` plus ONE ``NOTIFY``.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from psycopg import sql as pgsql

from ..conf import get_settings
from ..core.validation import (
    validate_max_attempts,
    validate_priority,
    validate_queue_name,
    validate_task_name,
)
from ..models import ARCHIVE_TABLE, DEAD_TABLE, MESSAGE_TABLE
from .errors import BadInput, PipelineError
from .progress import Progress
from .rowcheck import check_row
from .session import JDBC_BATCHSIZE, jdbc_target

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CORRUPT_COLUMN = "_corrupt_record"
BAD_ROWS_SHOWN = 20
_FORMATS = {"parquet", "csv", "json"}
_EXTENSIONS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json"}
_EXTENSIONS[".ndjson"] = "json"


@dataclass
class EnqueueResult:
    batch_id: str
    rows: int = 0
    enqueued: int = 0
    duplicates: int = 0
    bad_count: int = 0
    bad_rows: list[tuple[int, str]] = field(default_factory=list)
    partitions: int = 0
    seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def read_input(spark: SparkSession, path: str, fmt: str | None = None) -> DataFrame:
    """Read a Parquet / CSV (with header) / JSON-lines path; malformed records are kept in
    ``_corrupt_record`` so they are reported as bad rows instead of silently dropped."""
    if fmt is None:
        lowered = path.lower().rstrip("/")
        fmt = next((f for ext, f in _EXTENSIONS.items() if lowered.endswith(ext)), "parquet")
    if fmt not in _FORMATS:
        raise PipelineError(f"Unknown input format {fmt!r}; use parquet, csv or json.")
    try:
        if fmt == "parquet":
            return spark.read.parquet(path)
        from pyspark.sql.types import StringType, StructField, StructType

        reader = spark.read.option("mode", "PERMISSIVE").option(
            "columnNameOfCorruptRecord", CORRUPT_COLUMN
        )
        if fmt == "csv":
            reader = reader.option("header", "true")
            inferred = spark.read.option("header", "true").csv(path).schema
            fields = [f for f in inferred.fields if f.name != CORRUPT_COLUMN]
            schema = StructType([*fields, StructField(CORRUPT_COLUMN, StringType())])
            return reader.schema(schema).csv(path)
        return reader.json(path)
    except Exception as exc:
        if type(exc).__name__ in {"AnalysisException", "Py4JJavaError"}:
            raise PipelineError(f"Cannot read {fmt} input {path}: {exc}") from exc
        raise


def enqueue_frame(
    spark: SparkSession,
    data: DataFrame | str,
    *,
    task: str,
    queue: str | None = None,
    input_format: str | None = None,
    payload_column: str | None = None,
    dedup_key_column: str | None = None,
    priority_column: str | None = None,
    tenant_column: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    batch_id: str | None = None,
    skip_bad: bool = False,
    check_history: bool = True,
    report: Callable[[str], None] | None = None,
    using: str | None = None,
) -> EnqueueResult:
    """Enqueue one message per row of ``data`` for ``task`` on ``queue``.

    The payload is ``payload_column`` (a JSON text column is parsed; any other type is taken
    as is), or, without it, the row's other columns as a JSON object. Run it again with the
    same input and ``batch_id`` (for a path, the default batch id is derived from the path,
    task and queue) and nothing is enqueued twice.
    """
    started = time.monotonic()
    conf = get_settings()
    alias = using or conf.DATABASE_ALIAS
    queue = validate_queue_name(conf.DEFAULT_QUEUE if queue is None else queue)
    task = validate_task_name(task)
    priority = validate_priority(priority)
    attempts = validate_max_attempts(
        conf.for_queue(queue, "MAX_ATTEMPTS") if max_attempts is None else max_attempts
    )
    if isinstance(data, str):
        batch_id = batch_id or hashlib.sha1(f"{data}\0{task}\0{queue}".encode()).hexdigest()[:16]
        frame = read_input(spark, data, input_format)
    else:
        batch_id = batch_id or uuid.uuid4().hex
        frame = data
    if not batch_id or len(batch_id) > 64 or ":" in batch_id:
        raise PipelineError("batch_id must be 1-64 characters without ':'.")
    for name in (payload_column, dedup_key_column, priority_column, tenant_column):
        if name is not None and name not in frame.columns:
            raise PipelineError(f"Column {name!r} not in the input (it has {frame.columns}).")
    result = EnqueueResult(batch_id=batch_id)
    progress = Progress("enqueue", 3, report)

    validated = _validate(
        spark,
        frame,
        batch_id=batch_id,
        payload_column=payload_column,
        dedup_key_column=dedup_key_column,
        priority_column=priority_column,
        tenant_column=tenant_column,
        default_priority=priority,
        max_bytes=conf.MAX_PAYLOAD_BYTES,
    ).cache()
    try:
        from pyspark.sql import functions as F

        # One pass gives every partition's size (for row numbers) and the bad-row count.
        sizes = {
            int(r["part"]): (int(r["rows"]), int(r["bad"]))
            for r in validated.groupBy("part")
            .agg(F.count(F.lit(1)).alias("rows"), F.count("error").alias("bad"))
            .collect()
        }
        result.rows = sum(rows for rows, _ in sizes.values())
        result.bad_count = sum(bad for _, bad in sizes.values())
        if result.bad_count:
            first_row, running = {}, 0
            for part in sorted(sizes):
                first_row[part] = running
                running += sizes[part][0]
            bad = validated.where(F.col("error").isNotNull())
            result.bad_rows = [
                (first_row[int(r["part"])] + int(r["row_no"]) + 1, r["error"])
                for r in bad.orderBy("part", "row_no").limit(BAD_ROWS_SHOWN).collect()
            ]
            if not skip_bad:
                shown = "; ".join(f"row {n}: {e}" for n, e in result.bad_rows)
                raise BadInput(
                    f"{result.bad_count} of {result.rows} input rows are invalid; nothing was "
                    f"enqueued (pass skip_bad / --skip-bad to enqueue the valid rows). {shown}",
                    result.bad_rows,
                    result.bad_count,
                )
        progress.advance(0, note=f"validated {result.rows:,} rows, {result.bad_count} bad")
        good = validated.where(F.col("error").isNull()).drop("error")
        stage = _stage_name(batch_id)
        _create_stage(stage, alias)
        try:
            target = jdbc_target(alias)
            (
                good.write.format("jdbc")
                .options(**target.options(dbtable=stage, batchsize=JDBC_BATCHSIZE))
                .mode("append")
                .save()
            )
            progress.advance(0, note="staged")
            parts = _partitions(stage, alias)
            result.partitions = len(parts)
            if check_history:
                _drop_finished_keys(stage, queue, alias)
            moved = Progress("enqueue", len(parts), report)
            for part, staged_rows in parts:
                written = _move_partition(stage, part, queue, task, attempts, alias)
                result.enqueued += written
                moved.advance(written, note=f"partition {part}: {staged_rows:,} staged")
        finally:
            with connections[alias].cursor() as cursor:
                cursor.execute(pgsql.SQL("DROP TABLE IF EXISTS {}").format(pgsql.Identifier(stage)))
    finally:
        validated.unpersist()
    result.duplicates = result.rows - result.bad_count - result.enqueued
    result.seconds = time.monotonic() - started
    return result


def _validate(
    spark: SparkSession,
    frame: DataFrame,
    *,
    batch_id: str,
    payload_column: str | None,
    dedup_key_column: str | None,
    priority_column: str | None,
    tenant_column: str | None,
    default_priority: int,
    max_bytes: int,
) -> DataFrame:
    """Row number, partition, payload JSON, dedup key, priority, tenant and error per row."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    special = {c for c in (dedup_key_column, priority_column, tenant_column) if c}
    corrupt = CORRUPT_COLUMN in frame.columns
    payload_is_text = False
    if payload_column is not None:
        payload_is_text = dict(frame.dtypes)[payload_column] == "string"
        payload = F.col(payload_column)
        payload = payload if payload_is_text else F.to_json(F.struct(payload.alias("v")))
    else:
        rest = [c for c in frame.columns if c not in special and c != CORRUPT_COLUMN]
        if not rest:
            raise PipelineError("The input has no payload columns.")
        payload = F.to_json(F.struct(*rest))
        payload_is_text = True  # a JSON object already; parsed again so the rules apply
    columns = [
        payload.alias("payload"),
        (F.col(dedup_key_column).cast("string") if dedup_key_column else F.lit(None))
        .cast("string")
        .alias("dedup_key"),
        (F.col(priority_column) if priority_column else F.lit(None)).cast("string").alias("prio"),
        (F.col(tenant_column).cast("string") if tenant_column else F.lit(None))
        .cast("string")
        .alias("tenant"),
        (F.col(CORRUPT_COLUMN) if corrupt else F.lit(None)).cast("string").alias("corrupt"),
    ]
    wrapped_value = payload_column is not None and not payload_is_text
    schema = StructType(
        [
            StructField("part", IntegerType()),
            StructField("row_no", LongType()),
            StructField("payload", StringType()),
            StructField("dedup_key", StringType()),
            StructField("priority", IntegerType()),
            StructField("tenant", StringType()),
            StructField("error", StringType()),
        ]
    )

    def check(batches: Iterable[Any]) -> Iterator[Any]:
        # Arrow batches in, Arrow batches out: no per-row pickling between JVM and Python.
        import pyarrow as pa
        from pyspark import TaskContext

        arrow_schema = pa.schema(
            [
                ("part", pa.int32()),
                ("row_no", pa.int64()),
                ("payload", pa.string()),
                ("dedup_key", pa.string()),
                ("priority", pa.int32()),
                ("tenant", pa.string()),
                ("error", pa.string()),
            ]
        )
        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        row_no = 0
        for batch in batches:
            columns = batch.to_pydict()
            out: dict[str, list[Any]] = {name: [] for name in schema.fieldNames()}
            for i in range(batch.num_rows):
                checked = check_row(
                    columns["payload"][i],
                    columns["dedup_key"][i],
                    columns["prio"][i],
                    columns["tenant"][i],
                    columns["corrupt"][i],
                    key_prefix=f"{batch_id}:{part}:",
                    row_no=row_no,
                    wrapped=wrapped_value,
                    default_priority=default_priority,
                    max_bytes=max_bytes,
                )
                out["part"].append(part)
                out["row_no"].append(row_no)
                for name, value in zip(
                    ("payload", "dedup_key", "priority", "tenant", "error"), checked, strict=True
                ):
                    out[name].append(value)
                row_no += 1
            yield pa.RecordBatch.from_pydict(out, schema=arrow_schema)

    return frame.select(*columns).mapInArrow(check, schema)


def _stage_name(batch_id: str) -> str:
    return f"pgqueue_stage_{hashlib.sha1(batch_id.encode()).hexdigest()[:20]}"


def _create_stage(stage: str, alias: str) -> None:
    name = pgsql.Identifier(stage)
    with connections[alias].cursor() as cursor:
        cursor.execute(pgsql.SQL("DROP TABLE IF EXISTS {}").format(name))
        cursor.execute(
            pgsql.SQL(
                "CREATE UNLOGGED TABLE {} (row_no bigint NOT NULL, part int NOT NULL, "
                "payload text NOT NULL, dedup_key text NOT NULL, priority smallint NOT NULL, "
                "tenant text)"
            ).format(name)
        )


def _partitions(stage: str, alias: str) -> list[tuple[int, int]]:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            pgsql.SQL("SELECT part, count(*) FROM {} GROUP BY part ORDER BY part").format(
                pgsql.Identifier(stage)
            )
        )
        return [(int(part), int(rows)) for part, rows in cursor.fetchall()]


def _drop_finished_keys(stage: str, queue: str, alias: str) -> None:
    """Forget rows whose dedup key already finished (archive) or died on this queue."""
    name = pgsql.Identifier(stage)
    with connections[alias].cursor() as cursor:
        for table in (ARCHIVE_TABLE, DEAD_TABLE):
            cursor.execute(
                pgsql.SQL(
                    "DELETE FROM {} AS s USING {} AS h WHERE h.queue = %s "
                    "AND h.dedup_key = s.dedup_key"
                ).format(name, pgsql.Identifier(table)),
                [queue],
            )


def _move_partition(
    stage: str, part: int, queue: str, task: str, max_attempts: int, alias: str
) -> int:
    """One partition into the live table: one short transaction, one wake-up."""
    conf = get_settings()
    statement = pgsql.SQL(
        """
        INSERT INTO {message}
            (queue, task, payload, priority, tenant, dedup_key, max_attempts, available_at)
        SELECT DISTINCT ON (dedup_key) %s, %s, payload::jsonb, priority, tenant, dedup_key, %s,
               now()
        FROM {stage} WHERE part = %s
        ORDER BY dedup_key, row_no
        ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
        """
    ).format(message=pgsql.Identifier(MESSAGE_TABLE), stage=pgsql.Identifier(stage))
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(statement, [queue, task, max_attempts, part])
        written = cursor.rowcount
        if written and conf.NOTIFY:
            cursor.execute("SELECT pg_notify(%s, %s)", [conf.NOTIFY_CHANNEL, queue])
    return int(written)
