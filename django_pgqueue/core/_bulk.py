"""Validated rows into the live table in bulk: the one write path of ``enqueue_many()`` and
of the pipeline's partitions (``pipeline/bulkrows.py``).

The rows go in by one ``COPY`` (:func:`copy_rows`). A dedup key a live message holds makes
the ``COPY`` fail on the unique index; the caller rolls its transaction (or savepoint) back
and the rows go in by one ``INSERT ... ON CONFLICT DO NOTHING`` (:func:`insert_rows`), which
skips those rows and sends the wake-up it is given only when it wrote a row. The caller owns
the transactions around both, and the ``COPY``'s wake-up: each runs them its own way. Both
take a psycopg cursor and read no Django setting, so Spark's Python workers call them on a
connection of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _sql

__all__ = ["BulkRows", "copy_rows", "insert_rows"]


@dataclass(frozen=True, slots=True)
class BulkRows:
    """Rows that passed every check. Priority, tenant and place in the fair order are one
    value for every row or a list of one per row."""

    queue: str
    task: str
    max_attempts: int
    #: When they become available, as COPY text: a time, or ``now`` (the transaction's start).
    available_at: str
    headers_json: str | None
    #: JSON with every control character escaped (``encode_payload``'s, or Spark's
    #: ``to_json``): no tab or newline can occur in it.
    payloads: list[str]
    priority: int | list[int]
    tenant: str | list[str | None] | None
    dedup_keys: list[str | None] | None = None
    #: In a fair queue the place in its fair order (-1: placed by the first claims), else None.
    fair_order: float | list[float] | None = None


def copy_rows(cursor: Any, rows: BulkRows) -> None:
    """``COPY`` the rows into the live table, a few thousand rows per write.

    The COPY text is assembled here rather than row by row through ``write_row``: the
    columns every row shares are formatted once, and a payload needs only its backslashes
    doubled.
    """
    head = "\t".join(
        (
            _copy_value(rows.queue),
            _copy_value(rows.task),
            str(rows.max_attempts),
            rows.available_at,
            _copy_value(rows.headers_json),
            "",
        )
    )
    tails = _tails(rows)
    with cursor.copy(_sql.BULK_COPY) as copy:
        for start in range(0, len(rows.payloads), _ROWS_PER_WRITE):
            stop = start + _ROWS_PER_WRITE
            if isinstance(tails, str):  # the same columns around every payload
                # Newlines cannot occur in the payloads: join on them, escape the chunk's
                # backslashes in one pass, and put the shared columns where they were.
                body = "\n".join(rows.payloads[start:stop]).replace("\\", "\\\\")
                copy.write(f"{head}{body.replace('\n', f'{tails}\n{head}')}{tails}\n")
                continue
            copy.write(
                "".join(
                    f"{head}{payload.replace('\\', '\\\\')}{tail}\n"
                    for payload, tail in zip(
                        rows.payloads[start:stop], tails[start:stop], strict=True
                    )
                )
            )


def insert_rows(cursor: Any, rows: BulkRows, wake: tuple[str, str] | None = None) -> int:
    """``INSERT`` the rows, skipping each whose key a live message of the queue holds; how
    many were written. ``wake``: a NOTIFY's channel and payload, sent in the same statement
    when a row was written."""
    count = len(rows.payloads)
    channel, wake_payload = wake if wake is not None else (None, None)
    cursor.execute(
        _sql.BULK_INSERT_SKIPPING_HELD_KEYS,
        {
            "queue": rows.queue,
            "task": rows.task,
            "max_attempts": rows.max_attempts,
            "available_at": rows.available_at,
            "headers": rows.headers_json,
            "payloads": rows.payloads,
            "priorities": _per_row(rows.priority, count),
            "tenants": _per_row(rows.tenant, count),
            "keys": rows.dedup_keys,
            "places": _per_row(rows.fair_order, count),
            "channel": channel,
            "wake": wake_payload,
        },
    )
    return int(cursor.fetchone()[0])


def _per_row(value: Any, count: int) -> Any:
    """A column's values, one per row: its list, or its one value repeated; ``None`` stays
    ``None`` (the INSERT's ``ROWS FROM`` pads a column NULL in every row)."""
    if value is None or isinstance(value, list):
        return value
    return [value] * count


def _tails(rows: BulkRows) -> str | list[str]:
    """What follows each payload (priority, tenant, dedup key, place in the fair order) as
    COPY text: one text when every row shares them, else one per row."""
    fields = [
        _copy_field(rows.priority),
        _copy_field(rows.tenant),
        _copy_field(rows.dedup_keys),
        _copy_field(rows.fair_order),
    ]
    if all(isinstance(field, str) for field in fields):
        return "".join(f"\t{field}" for field in fields)
    count = len(rows.payloads)
    columns = [_per_row(field, count) for field in fields]
    return ["\t" + "\t".join(values) for values in zip(*columns, strict=True)]


def _copy_field(value: Any) -> str | list[str]:
    if isinstance(value, list):
        return [_copy_value(item) for item in value]
    return _copy_value(value)


_ROWS_PER_WRITE = 2000
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_value(value: str | float | None) -> str:
    """``value`` as a field of COPY's text format."""
    if value is None:
        return "\\N"
    # The plain value of a subclass (an IntEnum priority, a str Enum key), as a single
    # enqueue stores it: never its repr or its str().
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value)  # reads back as the same float
    value = str.__str__(value)
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_COPY_ESCAPES)
    return value
