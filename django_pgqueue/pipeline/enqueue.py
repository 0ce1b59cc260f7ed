"""enqueue: bulk-enqueue a DataFrame, or a Parquet / CSV / JSON path, as messages.

How a row becomes a message, in order:

1. every row is validated by the rules :func:`django_pgqueue.enqueue` applies, in Spark's
   Python workers on Arrow batches (vectorized; rows in any doubt go through
   :func:`rowcheck.check_row`, the same functions ``enqueue()`` uses); each row gets a dedup
   key: its own column's value, or ``<batch_id>:<hash of the row's content>`` (payload,
   priority and tenant), which does not depend on how Spark splits the input: a re-run with
   other partitions, cores or master finds the same keys;
2. with any bad row and ``skip_bad=False`` (the default) NOTHING is written and
   :class:`BadInput` lists the bad rows (a first, validating pass sees every row before the
   writing pass starts); with ``skip_bad=True`` the good rows are enqueued and the bad ones
   reported in the result (and :class:`BadInput` when no row at all was valid);
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
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.db import connections

from ..conf import get_settings
from ..core._validation import (
    validate_max_attempts,
    validate_priority,
    validate_queue_name,
    validate_task_name,
)
from ..exceptions import BadInput, InvalidMessage, PipelineError
from ..models import ARCHIVE_TABLE, DEAD_TABLE
from .bulkrows import BAD_ROWS_SHOWN, BulkJob, run_partition
from .models import BULK_VOTE_TABLE, BulkEnqueueVote
from .progress import Progress, SparkJobWatch
from .session import psycopg_dsn

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CORRUPT_COLUMN = "_corrupt_record"
_FORMATS = {"parquet", "csv", "json"}
_EXTENSIONS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json"}
_EXTENSIONS[".ndjson"] = "json"
#: Hex digits of the content hash in a generated dedup key: 128 bits, no collision in practice.
CONTENT_HASH_DIGITS = 32


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


@dataclass(frozen=True)
class EnqueueTarget:
    """Where the messages go and with what defaults: checked before Spark does any work."""

    queue: str
    task: str
    priority: int
    max_attempts: int


def check_target(
    *,
    task: str,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
) -> EnqueueTarget:
    """The queue, task and defaults validated by the rules of ``enqueue()``, or a one-line
    :class:`PipelineError` (the command calls this before it starts Spark)."""
    conf = get_settings()
    try:
        queue = validate_queue_name(conf.DEFAULT_QUEUE if queue is None else queue)
        attempts = conf.for_queue(queue, "MAX_ATTEMPTS") if max_attempts is None else max_attempts
        return EnqueueTarget(
            queue=queue,
            task=validate_task_name(task),
            priority=validate_priority(priority),
            max_attempts=validate_max_attempts(attempts),
        )
    except InvalidMessage as exc:
        raise PipelineError(str(exc)) from exc


def check_batch_id(batch_id: str) -> str:
    if not batch_id or len(batch_id) > 64 or ":" in batch_id:
        raise PipelineError("batch_id must be 1-64 characters without ':'.")
    return batch_id


def input_format(path: str, fmt: str | None = None) -> str:
    """The format of an input path (from its extension unless given); a local path that does
    not exist is refused here, before Spark starts."""
    if fmt is None:
        lowered = path.lower().rstrip("/")
        fmt = next((f for ext, f in _EXTENSIONS.items() if lowered.endswith(ext)), "parquet")
    if fmt not in _FORMATS:
        raise PipelineError(f"Unknown input format {fmt!r}; use parquet, csv or json.")
    parts = urlsplit(path)
    local = parts.scheme in ("", "file") and not any(c in path for c in "*?[{")
    if local and not Path(parts.path if parts.scheme else path).exists():
        raise PipelineError(f"Input {path} does not exist.")
    return fmt


def read_input(spark: SparkSession, path: str, fmt: str | None = None) -> DataFrame:
    """Read a Parquet / CSV / JSON-lines path; malformed records are kept in
    ``_corrupt_record`` so they are reported as bad rows instead of silently dropped.

    CSV is read as RFC 4180 says: a header line, fields quoted with ``"``, a ``"`` inside a
    quoted field doubled, line breaks allowed inside quoted fields. A file holding quoted line
    breaks cannot be split at arbitrary bytes, so Spark parses each CSV file in one task.
    """
    fmt = input_format(path, fmt)
    try:
        if fmt == "parquet":
            return spark.read.parquet(path)
        from pyspark.sql.types import StringType, StructField, StructType

        reader = spark.read.option("mode", "PERMISSIVE").option(
            "columnNameOfCorruptRecord", CORRUPT_COLUMN
        )
        if fmt == "csv":
            rfc4180 = {"header": "true", "quote": '"', "escape": '"', "multiLine": "true"}
            inferred = spark.read.options(**rfc4180).csv(path).schema
            fields = [f for f in inferred.fields if f.name != CORRUPT_COLUMN]
            schema = StructType([*fields, StructField(CORRUPT_COLUMN, StringType())])
            return reader.options(**rfc4180).schema(schema).csv(path)
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
    drop_mapped_columns: bool = False,
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
    as is), or, without it, the row's columns as a JSON object: all of them, the dedup key,
    priority and tenant columns included unless ``drop_mapped_columns``. Run it again with
    the same input and ``batch_id`` (for a path, the default batch id is derived from the
    path, task and queue) and nothing is enqueued twice, however Spark splits the input.
    """
    started = time.monotonic()
    conf = get_settings()
    alias = using or conf.DATABASE_ALIAS
    target = check_target(task=task, queue=queue, priority=priority, max_attempts=max_attempts)
    queue, task = target.queue, target.task
    if isinstance(data, str):
        batch_id = batch_id or hashlib.sha1(f"{data}\0{task}\0{queue}".encode()).hexdigest()[:16]
        check_batch_id(batch_id)
        frame = read_input(spark, data, input_format)
    else:
        batch_id = check_batch_id(batch_id or uuid.uuid4().hex)
        frame = data
    for name in (payload_column, dedup_key_column, priority_column, tenant_column):
        if name is not None and name not in frame.columns:
            raise PipelineError(f"Column {name!r} not in the input (it has {frame.columns}).")
    result = EnqueueResult(batch_id=batch_id)

    prepared, wrapped, trusted_json = _prepare(
        frame,
        batch_id=batch_id,
        payload_column=payload_column,
        dedup_key_column=dedup_key_column,
        priority_column=priority_column,
        tenant_column=tenant_column,
        drop_mapped_columns=drop_mapped_columns,
    )
    job = BulkJob(
        dsn=psycopg_dsn(alias),
        queue=queue,
        task=task,
        max_attempts=target.max_attempts,
        batch_id=batch_id,
        default_priority=target.priority,
        max_bytes=conf.MAX_PAYLOAD_BYTES,
        trusted_json=trusted_json,
        wrapped=wrapped,
        check_history=check_history,
        notify_channel=conf.NOTIFY_CHANNEL if conf.NOTIFY else None,
        history_tables=(ARCHIVE_TABLE, DEAD_TABLE),
        out_of_fair_order=_is_fair(queue),
    )
    if check_history and not _history_holds_keys(queue, alias):
        job = replace(job, check_history=False)  # nothing to probe: skip it per partition
    partitions = prepared.rdd.getNumPartitions()
    one_pass = not skip_bad and _fits_one_barrier_stage(spark, partitions)
    passes = 1 if skip_bad or one_pass else 2
    progress = Progress("enqueue", passes, report, unit="passes")
    progress.say(f"{partitions} partitions to {queue!r}, batch {batch_id}")
    if one_pass:
        # All-or-nothing in one pass: the partitions run at once (a barrier stage), validate,
        # vote through the database, and write only if no partition found a bad row.
        job = replace(job, vote_table=BULK_VOTE_TABLE, run_id=uuid.uuid4().hex)
        try:
            with SparkJobWatch(spark, progress, "validating and writing"):
                output = _run(prepared, job, write=True, all_or_nothing=True, barrier=True)
            _tally(result, output)
        finally:
            BulkEnqueueVote.objects.using(alias).filter(run_id=job.run_id).delete()
        if result.bad_count:
            raise _bad_input(result)
        progress.advance(result.enqueued, note=f"validated and written, {partitions} partitions")
    # Otherwise all-or-nothing needs every row checked before any is written: a validating
    # pass, then the writing pass reads the input again (not cached here: cache an input
    # that is expensive to compute).
    elif not skip_bad:
        with SparkJobWatch(spark, progress, "validating"):
            _tally(result, _run(prepared, job, write=False))
        if result.bad_count:
            raise _bad_input(result)
        progress.advance(0, note="validated, no bad row")
    if not one_pass:
        with SparkJobWatch(spark, progress, "writing"):
            _tally(result, _run(prepared, job, write=True, all_or_nothing=not skip_bad))
        progress.advance(
            result.enqueued,
            note=f"{result.partitions} partitions written, {result.bad_count:,} bad rows",
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
    if result.bad_count and result.bad_count == result.rows:
        shown = "; ".join(f"row {n}: {e}" for n, e in result.bad_rows)
        raise BadInput(
            f"all {result.rows} input rows are invalid: nothing was enqueued. {shown}",
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


def _fits_one_barrier_stage(spark: SparkSession, partitions: int) -> bool:
    """Whether every partition can run at once (a barrier stage): no more partitions than
    task slots, and no dynamic allocation (barrier stages refuse it). Larger inputs take two
    passes rather than being squeezed into fewer, larger partitions held in memory."""
    conf = spark.sparkContext.getConf()
    if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        return False
    return partitions <= spark.sparkContext.defaultParallelism


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
    batch_id: str,
    payload_column: str | None,
    dedup_key_column: str | None,
    priority_column: str | None,
    tenant_column: str | None,
    drop_mapped_columns: bool,
) -> tuple[DataFrame, bool, bool]:
    """(payload text, dedup key, priority text, tenant, corrupt record) per row, plus
    whether the payload is wrapped as ``{"v": value}`` and whether Spark wrote its JSON."""
    from pyspark.sql import functions as F

    mapped = {c for c in (dedup_key_column, priority_column, tenant_column) if c}
    corrupt = CORRUPT_COLUMN in frame.columns
    payload_is_text = False
    if payload_column is not None:
        payload_is_text = dict(frame.dtypes)[payload_column] == "string"
        payload = F.col(payload_column)
        payload = payload if payload_is_text else F.to_json(F.struct(payload.alias("v")))
    else:
        dropped = mapped if drop_mapped_columns else set()
        rest = [c for c in frame.columns if c not in dropped and c != CORRUPT_COLUMN]
        if not rest:
            raise PipelineError("The input has no payload columns.")
        payload = F.to_json(F.struct(*rest))
    prio = (F.col(priority_column) if priority_column else F.lit(None)).cast("string")
    tenant = (F.col(tenant_column) if tenant_column else F.lit(None)).cast("string")
    # The row's own identity: what the message will carry. Not its position, which depends
    # on how Spark split the input (cores, master, file splits).
    content = F.concat_ws("\x1f", *(F.coalesce(c, F.lit("\\N")) for c in (payload, prio, tenant)))
    content_key = F.concat(
        F.lit(f"{batch_id}:"), F.substring(F.sha2(content, 256), 1, CONTENT_HASH_DIGITS)
    )
    key = F.col(dedup_key_column).cast("string") if dedup_key_column else F.lit(None)
    columns = [
        payload.alias("payload"),
        F.coalesce(key.cast("string"), content_key).alias("dedup_key"),
        prio.alias("prio"),
        tenant.alias("tenant"),
        (F.col(CORRUPT_COLUMN) if corrupt else F.lit(None)).cast("string").alias("corrupt"),
    ]
    wrapped = payload_column is not None and not payload_is_text
    return frame.select(*columns), wrapped, payload_column is None


def _is_fair(queue: str) -> bool:
    """Rows of a fair queue go in outside its fair order: the first claims place them."""
    from ..core._flow_control import flow_config

    flow = flow_config(queue)
    return flow is not None and flow.keyed
