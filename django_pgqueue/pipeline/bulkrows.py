"""Executor side of bulk enqueue: validate Arrow batches, COPY each partition into the queue.

Runs inside Spark's Python workers (``mapInArrow``), so it needs neither Django's settings nor
pyspark; the driver hands it a :class:`BulkJob`.

Validation is vectorized: pyarrow compute functions decide, per batch, which rows are
certainly valid by the rules of ``enqueue()`` (a JSON object Spark's ``to_json`` wrote, well
under ``MAX_PAYLOAD_BYTES``, no NUL, no NaN/Infinity, keys and tenant of a valid length, a
plain integer priority in range). Every other row (user JSON text, a corrupt record, any
doubt) goes through :func:`rowcheck.check_row`, the row-by-row check, which has the last word.

Writing: one transaction per partition, on a connection of its own, through the write path
of ``enqueue_many()`` (``core/_bulk.py``): one ``COPY`` straight into ``pgqueue_message`` and
one ``NOTIFY``. Keys repeated inside the partition keep their first row, keys already in the
archive or the dead letters of the queue are dropped first (one hashed ``= ANY`` probe per
table), and when the ``COPY`` meets a live key (a retried task, another partition, another
producer) it is rolled back and the partition goes in again as one ``INSERT ... SELECT FROM
unnest(...) ON CONFLICT DO NOTHING`` (arrays as parameters: no temporary table, so no TEMP
privilege needed): the rare path pays for dedup, the common one does not. Unlike
``enqueue_many()``, live keys are not looked up once the ``COPY`` met one (a partition's keys
are new but for a retry), and in a fair queue the rows, of many tenants, go in outside the
fair order, placed by the first claims.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..core._bulk import BulkRows, copy_rows, insert_rows
from ..core._sql import NOTIFY_QUEUES
from ..core._validation import DEDUP_KEY_MAX_LENGTH, MAX_PRIORITY, MIN_PRIORITY, TENANT_MAX_LENGTH
from .rowcheck import check_row

#: Rows whose payload is within this share of the cap are sized exactly, row by row.
SIZE_HEADROOM = 0.9
BAD_ROWS_SHOWN = 20
PRIORITY_TEXT = r"^-?[0-9]{1,3}$"


@dataclass(frozen=True)
class BulkJob:
    dsn: str
    queue: str
    task: str
    max_attempts: int
    batch_id: str
    default_priority: int
    max_bytes: int
    trusted_json: bool  # payload is Spark's to_json of the row: valid JSON unless flagged
    wrapped: bool  # payload is {"v": value}: the message payload is the value
    check_history: bool
    notify_channel: str | None
    history_tables: tuple[str, ...]
    # One-pass all-or-nothing (a barrier stage): where partitions vote, and this call's id.
    vote_table: str = ""
    run_id: str = ""
    # A fair queue: rows go in with fair_order -1, placed in the fair order by the first
    # claims after (core/_flow_control.py), as scheduled messages are.
    out_of_fair_order: bool = False


#: How long a partition that has voted waits for the others' votes, and at most between two
#: counts of them (a vote wakes the waiters at once through NOTIFY).
VOTE_TIMEOUT_SECONDS = 600.0
VOTE_RECOUNT_SECONDS = 1.0
#: How long a COPY written before the vote waits for a row lock before it gives up.
VOTE_LOCK_TIMEOUT_MS = 200


def output_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("part", pa.int32()),
            ("row_no", pa.int64()),
            ("error", pa.string()),
            ("rows", pa.int64()),
            ("bad", pa.int64()),
            ("enqueued", pa.int64()),
        ]
    )


def _certainly_valid(job: BulkJob, batch: Any) -> tuple[Any, Any]:
    """(mask of rows valid without a row-by-row check, their priority as int64)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    if not job.trusted_json or job.wrapped:
        return pa.array([False] * n), pa.nulls(n, pa.int64())

    def null_or(column: Any, condition: Any) -> Any:
        return pc.fill_null(pc.or_kleene(pc.is_null(column), condition), False)

    def length_ok(column: Any, limit: int) -> Any:
        length = pc.utf8_length(column)
        fits = pc.and_(pc.greater_equal(length, 1), pc.less_equal(length, limit))
        # Text with U+0000 goes to check_row, which refuses it as enqueue() does.
        return null_or(column, pc.and_(fits, pc.invert(pc.match_substring(column, "\x00"))))

    payload = batch.column("payload")
    ok = pc.and_(pc.is_null(batch.column("corrupt")), pc.is_valid(payload))
    ok = pc.and_(ok, pc.less_equal(pc.binary_length(payload), int(job.max_bytes * SIZE_HEADROOM)))
    # jsonb cannot store U+0000; to_json writes NaN/Infinity unquoted, which is not JSON; a
    # raw tab or line break (never in to_json's text) would break the COPY text.
    suspicious = pc.match_substring_regex(payload, r"\\u0000|\x00|NaN|Infinity|[\t\n\r]")
    ok = pc.and_(ok, pc.invert(suspicious))
    ok = pc.and_(ok, length_ok(batch.column("dedup_key"), DEDUP_KEY_MAX_LENGTH))
    ok = pc.and_(ok, length_ok(batch.column("tenant"), TENANT_MAX_LENGTH))
    text = batch.column("prio")
    plain = pc.fill_null(pc.match_substring_regex(text, PRIORITY_TEXT), False)
    priority = pc.cast(pc.if_else(plain, text, pa.scalar(None, pa.string())), pa.int64())
    in_range = pc.and_(
        pc.greater_equal(priority, MIN_PRIORITY), pc.less_equal(priority, MAX_PRIORITY)
    )
    ok = pc.and_(ok, null_or(text, pc.fill_null(in_range, False)))
    return pc.fill_null(ok, False), priority


def validate_batch(job: BulkJob, batch: Any, first_row: int) -> tuple[Any, list[tuple[int, str]]]:
    """(good rows as an Arrow table, [(row_no, reason)] of the bad ones) of one batch."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    row_no = pa.array(np.arange(first_row, first_row + n, dtype=np.int64))
    ok, priority = _certainly_valid(job, batch)
    payload = batch.column("payload")
    key = batch.column("dedup_key")  # the row's column, or its content hash (never null)
    tenant = batch.column("tenant")
    priority = pc.fill_null(priority, job.default_priority)
    bad: list[tuple[int, str]] = []
    doubtful = np.flatnonzero(~ok.to_numpy(zero_copy_only=False))
    keep = np.ones(n, dtype=bool)
    if len(doubtful):
        payloads, keys = payload.to_pylist(), key.to_pylist()
        priorities, tenants = priority.to_pylist(), tenant.to_pylist()
        raw = [batch.column(c).to_pylist() for c in ("dedup_key", "prio", "corrupt")]
        for i in doubtful.tolist():
            checked = check_row(
                payloads[i],
                raw[0][i],
                raw[1][i],
                tenants[i],
                raw[2][i],
                wrapped=job.wrapped,
                default_priority=job.default_priority,
                max_bytes=job.max_bytes,
            )
            if checked[4] is not None:
                bad.append((first_row + i, checked[4]))
                keep[i] = False
            else:
                payloads[i], keys[i], priorities[i], tenants[i] = checked[:4]
        payload, key = pa.array(payloads, pa.string()), pa.array(keys, pa.string())
        priority, tenant = pa.array(priorities, pa.int64()), pa.array(tenants, pa.string())
    good = pa.table(
        {
            "row_no": row_no,
            "payload": payload,
            "dedup_key": key,
            "priority": pc.cast(priority, pa.int16()),
            "tenant": tenant,
        }
    )
    if not keep.all():
        good = good.filter(pa.array(keep))
    return good, bad


def _first_of_each_key(table: Any, seen: set[str]) -> Any:
    """Rows whose key was not seen before in this partition (the first one wins)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pc.count_distinct(table.column("dedup_key")).as_py() == table.num_rows:
        return table  # the usual case, decided without a loop in Python
    keep = []
    for key in table.column("dedup_key").to_pylist():
        keep.append(key not in seen)
        seen.add(key)
    return table if all(keep) else table.filter(pa.array(keep))


def _drop_finished(job: BulkJob, conn: Any, table: Any) -> Any:
    """Rows whose key already finished (archive) or died on this queue are not enqueued."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = table.column("dedup_key").to_pylist()
    finished: list[str] = []
    for history in job.history_tables:
        # A constant array: PostgreSQL hashes "= ANY", one pass over the queue's rows.
        rows = conn.execute(
            f"SELECT dedup_key FROM {history} WHERE queue = %s AND dedup_key = ANY(%s)",
            [job.queue, keys],
        ).fetchall()
        finished += [row[0] for row in rows]
    conn.commit()
    if not finished:
        return table
    return table.filter(pc.invert(pc.is_in(table.column("dedup_key"), pa.array(finished))))


def write_partition(
    job: BulkJob, conn: Any, table: Any, commit_if: Callable[[], bool] | None = None
) -> int:
    """The partition's rows into the live table by ``enqueue_many()``'s write path
    (``core/_bulk.py``): one transaction, one NOTIFY; rows written.

    ``commit_if`` (all-or-nothing in one pass: the partition's vote) is asked once the rows
    are in, before they are committed: the database works on this partition's rows while the
    others still validate theirs. False rolls them back and nothing is written.
    """
    import psycopg

    verdict: list[bool] = []

    def valid() -> bool:
        if commit_if is None:
            return True
        if not verdict:
            verdict.append(commit_if())
        return verdict[0]

    rows = BulkRows(
        queue=job.queue,
        task=job.task,
        max_attempts=job.max_attempts,
        available_at="now",
        headers_json=None,
        payloads=table.column("payload").to_pylist(),
        priority=table.column("priority").to_pylist(),
        tenant=table.column("tenant").to_pylist(),
        dedup_keys=table.column("dedup_key").to_pylist(),
        fair_order=-1.0 if job.out_of_fair_order else None,
    )
    try:
        with conn.transaction(), conn.cursor() as cursor:
            if commit_if is not None:
                # A key another partition holds uncommitted while it waits for this one's
                # vote would wait forever: give the COPY up at once, go the ON CONFLICT way
                # below once everyone voted.
                cursor.execute(f"SET LOCAL lock_timeout = '{VOTE_LOCK_TIMEOUT_MS}ms'")
            copy_rows(cursor, rows)
            _notify(job, cursor)
            if not valid():
                raise psycopg.Rollback()
        return len(rows.payloads) if valid() else 0
    except (
        psycopg.errors.UniqueViolation,
        psycopg.errors.DeadlockDetected,
        psycopg.errors.LockNotAvailable,
    ):
        pass  # some keys are live already: insert the others, skipping those
    if not valid():
        return 0
    with conn.transaction(), conn.cursor() as cursor:
        return insert_rows(
            cursor, rows, (job.notify_channel, job.queue) if job.notify_channel else None
        )


def _notify(job: BulkJob, cursor: Any) -> None:
    """The queue's wake-up, sent at commit (``core/_notify.py``: its rows are ready now)."""
    if job.notify_channel:
        cursor.execute(NOTIFY_QUEUES, [job.notify_channel, [job.queue]])


def _input_is_valid(job: BulkJob, part: int, bad: int, voters: int) -> bool:
    """Vote, then wait for every partition's vote: whether none found a bad row.

    Through the database rather than ``BarrierTaskContext.allGather``, whose wait polls once
    a second (a second per call is most of the time of a 100,000-row input). Each vote sends
    a NOTIFY that wakes the waiting partitions: they sleep instead of polling, leaving the
    cores to the partitions still validating. The partitions of a barrier stage run at once,
    so the wait ends; a stage that dies is retried as a whole and its partitions vote again
    (the same verdicts: they read the same input).
    """
    import time

    import psycopg

    deadline = time.monotonic() + VOTE_TIMEOUT_SECONDS
    channel = f"pgq_vote_{job.run_id}"  # run_id is hex: a valid identifier
    with psycopg.connect(job.dsn, autocommit=True) as conn:
        conn.execute(f"LISTEN {channel}")  # before voting: no later vote goes unheard
        conn.execute(
            f"INSERT INTO {job.vote_table} (run_id, part, bad_rows) VALUES (%s, %s, %s) "
            "ON CONFLICT (run_id, part) DO UPDATE SET bad_rows = EXCLUDED.bad_rows",
            [job.run_id, part, bad],
        )
        conn.execute("SELECT pg_notify(%s, '')", [channel])
        while True:
            row = conn.execute(
                f"SELECT count(*), count(*) FILTER (WHERE bad_rows > 0) FROM {job.vote_table} "
                "WHERE run_id = %s",
                [job.run_id],
            ).fetchone()
            voted, with_bad = row if row is not None else (0, 0)
            if with_bad:
                return False
            if voted >= voters:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{voted} of {voters} partitions voted in "
                    f"{VOTE_TIMEOUT_SECONDS:.0f}s; the stage is retried"
                )
            for _ in conn.notifies(timeout=min(left, VOTE_RECOUNT_SECONDS), stop_after=1):
                pass


class _Vote:
    """A partition's all-or-nothing vote, cast once, when first asked for its verdict."""

    def __init__(self, job: BulkJob, part: int, bad: int, voters: int) -> None:
        self.job, self.part, self.bad, self.voters = job, part, bad, voters
        self.verdict: bool | None = None

    def __call__(self) -> bool:
        if self.verdict is None:
            self.verdict = _input_is_valid(self.job, self.part, self.bad, self.voters)
        return self.verdict


def run_partition(
    job: BulkJob,
    batches: Iterable[Any],
    *,
    write: bool,
    all_or_nothing: bool = False,
    barrier: bool = False,
) -> Iterator[Any]:
    """mapInArrow body: the first bad rows (with reasons), then the partition's summary row
    (``row_no`` -1: rows read, bad rows, rows enqueued). ``write=False`` only validates;
    ``all_or_nothing`` writes nothing from a partition holding a bad row. ``barrier`` (a
    barrier stage: every partition runs at once) writes nothing unless no partition of the
    whole input holds a bad row: all-or-nothing in one pass."""
    import psycopg
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    part = context.partitionId() if context is not None else 0
    schema = output_schema()
    row = 0
    bad: list[tuple[int, str]] = []
    good = []
    for batch in batches:
        table, batch_bad = validate_batch(job, batch, row)
        row += batch.num_rows
        bad += batch_bad
        if write:
            good.append(table)
    vote: Callable[[], bool] | None = None
    if barrier:
        from pyspark import BarrierTaskContext

        # The stage's tasks as run (adaptive execution may have merged partitions).
        voters = len(BarrierTaskContext.get().getTaskInfos())
        vote = _Vote(job, part, len(bad), voters)
        if bad or not write:
            write = write and vote()
    enqueued = 0
    if write and good and not (all_or_nothing and bad):
        rows = _first_of_each_key(pa.concat_tables(good), set())
        if rows.num_rows:
            with psycopg.connect(job.dsn) as conn:
                if job.check_history:
                    rows = _drop_finished(job, conn, rows)
                if rows.num_rows:
                    enqueued = write_partition(job, conn, rows, commit_if=vote)
    if vote is not None:
        vote()  # every partition votes, one with nothing to write too: the others wait for it
    shown = bad[:BAD_ROWS_SHOWN]  # the driver reports the first ones of the whole input
    yield pa.RecordBatch.from_pydict(
        {
            "part": [part] * (len(shown) + 1),
            "row_no": [r for r, _ in shown] + [-1],
            "error": [e for _, e in shown] + [None],
            "rows": [0] * len(shown) + [row],
            "bad": [0] * len(shown) + [len(bad)],
            "enqueued": [0] * len(shown) + [enqueued],
        },
        schema=schema,
    )
