"""enqueue: bulk-enqueue a DataFrame, or a Parquet / CSV / JSON path, as messages.

How a row becomes a message, in order:

1. every row is validated by the rules :func:`django_pgqueue.enqueue` applies, in Spark's
   Python workers on Arrow batches (vectorized; rows in any doubt go through
   :func:`rowcheck.check_row`, the same functions ``enqueue()`` uses); each row gets a dedup
   key: its own column's value, or ``<batch_id>:<partition>:<row>``;
2. with any bad row and ``skip_bad=False`` (the default) NOTHING is written and
   :class:`BadInput` lists the bad rows (a first, validating pass sees every row before the
   writing pass starts); with ``skip_bad=True`` the good rows are enqueued and the bad ones
   reported in the result;
3. each Spark partition writes its own rows (:mod:`bulkrows`): keys repeated in it keep their
   first row, keys already in the archive or the dead letters of that queue are dropped (live
   dedup keys only guard live messages: without this, a job retried after workers finished
   part of its messages would enqueue those again), then one transaction ``COPY``s the rest
   into the live table and sends ONE ``NOTIFY``; a live key already there (a retried task)
   makes it fall back to ``INSERT ... ON CONFLICT (queue, dedup_key) DO NOTHING``.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import connections

from ..conf import get_settings
from ..core.validation import (
    validate_max_attempts,
    validate_priority,
    validate_queue_name,
    validate_task_name,
)
from ..models import ARCHIVE_TABLE, DEAD_TABLE, MESSAGE_TABLE
from .bulkrows import BAD_ROWS_SHOWN, BulkJob, run_partition
from .errors import BadInput, PipelineError
from .models import BULK_VOTE_TABLE, BulkEnqueueVote
from .progress import Progress
from .session import psycopg_dsn

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CORRUPT_COLUMN = "_corrupt_record"
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
    progress = Progress("enqueue", 1 if skip_bad else 2, report)

    prepared, wrapped, trusted_json = _prepare(
        frame,
        payload_column=payload_column,
        dedup_key_column=dedup_key_column,
        priority_column=priority_column,
        tenant_column=tenant_column,
    )
    job = BulkJob(
        dsn=psycopg_dsn(alias),
        queue=queue,
        task=task,
        max_attempts=attempts,
        batch_id=batch_id,
        default_priority=priority,
        max_bytes=conf.MAX_PAYLOAD_BYTES,
        trusted_json=trusted_json,
        wrapped=wrapped,
        has_key_column=dedup_key_column is not None,
        check_history=check_history,
        notify_channel=conf.NOTIFY_CHANNEL if conf.NOTIFY else None,
        message_table=MESSAGE_TABLE,
        history_tables=(ARCHIVE_TABLE, DEAD_TABLE),
        out_of_fair_order=_is_fair(queue),
    )
    if check_history and not _history_holds_keys(queue, alias):
        job = replace(job, check_history=False)  # nothing to probe: skip it per partition
    one_pass = not skip_bad and _fits_one_barrier_stage(spark, prepared)
    if one_pass:
        # All-or-nothing in one pass: the partitions run at once (a barrier stage), validate,
        # vote through the database, and write only if no partition found a bad row.
        job = replace(job, vote_table=BULK_VOTE_TABLE, run_id=uuid.uuid4().hex)
        try:
            _tally(result, _run(prepared, job, write=True, all_or_nothing=True, barrier=True))
        finally:
            BulkEnqueueVote.objects.using(alias).filter(run_id=job.run_id).delete()
        if result.bad_count:
            raise _bad_input(result)
        progress.advance(0, note="validated in the same pass, no bad row")
        progress.advance(result.enqueued, note=f"{result.partitions} partitions written")
    # Otherwise all-or-nothing needs every row checked before any is written: a validating
    # pass, then the writing pass reads the input again (not cached here: cache an input
    # that is expensive to compute). The same checks as a Spark SQL filter measured slower.
    elif not skip_bad:
        _tally(result, _run(prepared, job, write=False))
        if result.bad_count:
            raise _bad_input(result)
        progress.advance(0, note="validated, no bad row")
    if not one_pass:
        _tally(result, _run(prepared, job, write=True, all_or_nothing=not skip_bad))
        progress.advance(
            result.enqueued,
            note=f"{result.partitions} partitions written, {result.bad_count} bad rows",
        )
    if result.bad_count and not skip_bad:
        # Only a non-deterministic input gets here: rows valid in the checking pass were
        # not when read again. Partitions holding a bad row wrote nothing; say what happened.
        shown = "; ".join(f"row {n}: {e}" for n, e in result.bad_rows)
        raise BadInput(
            f"{result.bad_count} of {result.rows} input rows were invalid when read a second "
            f"time (is the input non-deterministic? cache it); {result.enqueued} rows of the "
            f"partitions without bad rows were enqueued, the others not. {shown}",
            result.bad_rows,
            result.bad_count,
        )
    result.duplicates = result.rows - result.bad_count - result.enqueued
    result.seconds = time.monotonic() - started
    return result


def _bad_input(result: EnqueueResult) -> BadInput:
    shown = "; ".join(f"row {n}: {e}" for n, e in result.bad_rows)
    return BadInput(
        f"{result.bad_count} of {result.rows} input rows are invalid; nothing was "
        f"enqueued (pass skip_bad / --skip-bad to enqueue the valid rows). {shown}",
        result.bad_rows,
        result.bad_count,
    )


def _fits_one_barrier_stage(spark: SparkSession, frame: DataFrame) -> bool:
    """Whether every partition can run at once (a barrier stage): no more partitions than
    task slots, and no dynamic allocation (barrier stages refuse it). Larger inputs take two
    passes rather than being squeezed into fewer, larger partitions held in memory."""
    conf = spark.sparkContext.getConf()
    if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        return False
    return frame.rdd.getNumPartitions() <= spark.sparkContext.defaultParallelism


def _history_holds_keys(queue: str, alias: str) -> bool:
    """Whether the archive or the dead letters hold any dedup key of ``queue``."""
    with connections[alias].cursor() as cursor:
        for table in (ARCHIVE_TABLE, DEAD_TABLE):
            cursor.execute(
                f"SELECT 1 FROM {table} WHERE queue = %s AND dedup_key IS NOT NULL LIMIT 1",
                [queue],
            )
            if cursor.fetchone() is not None:
                return True
    return False


def _run(
    prepared: DataFrame,
    job: BulkJob,
    *,
    write: bool,
    all_or_nothing: bool = False,
    barrier: bool = False,
) -> list[Any]:
    """One Spark job over the prepared rows; returns the (small) per-partition output."""
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    schema = StructType(
        [
            StructField("part", IntegerType()),
            StructField("row_no", LongType()),
            StructField("error", StringType()),
            StructField("rows", LongType()),
            StructField("bad", LongType()),
            StructField("enqueued", LongType()),
        ]
    )
    body = partial(run_partition, job, write=write, all_or_nothing=all_or_nothing, barrier=barrier)
    return prepared.mapInArrow(body, schema, barrier=barrier).collect()


def _tally(result: EnqueueResult, output: list[Any]) -> None:
    """Rows, bad rows (numbered over the whole input) and enqueued counts of one pass."""
    summaries = {int(r["part"]): r for r in output if r["row_no"] == -1}
    first_row, running = {}, 0
    for part in sorted(summaries):
        first_row[part] = running
        running += int(summaries[part]["rows"])
    result.rows = running
    result.partitions = len(summaries)
    result.bad_count = sum(int(r["bad"]) for r in summaries.values())
    result.enqueued = sum(int(r["enqueued"]) for r in summaries.values())
    bad = sorted((int(r["part"]), int(r["row_no"]), r["error"]) for r in output if r["row_no"] >= 0)
    result.bad_rows = [(first_row[part] + row + 1, error) for part, row, error in bad][
        :BAD_ROWS_SHOWN
    ]


def _prepare(
    frame: DataFrame,
    *,
    payload_column: str | None,
    dedup_key_column: str | None,
    priority_column: str | None,
    tenant_column: str | None,
) -> tuple[DataFrame, bool, bool]:
    """(payload text, dedup key, priority text, tenant, corrupt record) per row, plus
    whether the payload is wrapped as ``{"v": value}`` and whether Spark wrote its JSON."""
    from pyspark.sql import functions as F

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
    wrapped = payload_column is not None and not payload_is_text
    return frame.select(*columns), wrapped, payload_column is None


def _is_fair(queue: str) -> bool:
    """Rows of a fair queue go in outside its fair order: the first claims place them."""
    from ..core.flow_control import flow_config

    flow = flow_config(queue)
    return flow is not None and flow.keyed
