"""The exported columns of each source table and the row hash in SQL and in Spark.

The checksum of a range is its row count plus the sum of a 32-bit row hash, the first 8 hex
digits of ``md5`` over a canonical text form of every column (:mod:`rowhash`, which computes
it in Python). PostgreSQL computes it over the table (:func:`sql_row_hash`: prune, as it
deletes), Spark over Parquet files (:func:`spark_row_hash`); the texts are built to be
byte-identical, so equal sums mean the files hold those rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..models import ARCHIVE_TABLE, DEAD_TABLE
from .rowhash import NULL_MARK, SEPARATOR

Kind = Literal["int", "text", "json", "ts"]


@dataclass(frozen=True)
class SourceTable:
    name: str  # "archive" or "dead": the sub-directory of the export
    table: str
    time_column: str  # partitions days, bounds ``keep_days`` and stats hours
    columns: tuple[tuple[str, Kind], ...]

    @property
    def select_list(self) -> str:
        """SELECT list for the JDBC read: JSON as its text, so Parquet keeps it verbatim."""
        return ", ".join(
            f"{name}::text AS {name}" if kind == "json" else name for name, kind in self.columns
        )


_SHARED: tuple[tuple[str, Kind], ...] = (
    ("id", "int"),
    ("message_id", "int"),
    ("queue", "text"),
    ("task", "text"),
    ("payload", "json"),
    ("priority", "int"),
    ("tenant", "text"),
    ("dedup_key", "text"),
    ("enqueued_at", "ts"),
    ("attempts", "int"),
    ("max_attempts", "int"),
    ("errors", "json"),
)

ARCHIVE = SourceTable(
    name="archive",
    table=ARCHIVE_TABLE,
    time_column="finished_at",
    columns=(
        *_SHARED,
        ("started_at", "ts"),
        ("finished_at", "ts"),
        ("worker_id", "text"),
        ("result", "json"),
    ),
)

DEAD = SourceTable(
    name="dead",
    table=DEAD_TABLE,
    time_column="died_at",
    columns=(
        *_SHARED,
        ("reason", "text"),
        ("details", "json"),
        ("worker_id", "text"),
        ("died_at", "ts"),
    ),
)

SOURCES = {ARCHIVE.name: ARCHIVE, DEAD.name: DEAD}


def sql_row_hash(source: SourceTable, alias: str = "") -> str:
    """SQL expression: the row's 32-bit hash as bigint (unsigned, so sums never overflow)."""
    prefix = f"{alias}." if alias else ""
    parts = []
    for name, kind in source.columns:
        column = f"{prefix}{name}"
        if kind == "ts":
            text = f"((extract(epoch FROM {column}) * 1000000)::bigint)::text"
        else:
            text = f"{column}::text"
        # NULL_MARK as an escape string: the same text whatever standard_conforming_strings.
        parts.append(f"coalesce({text}, E'\\\\N')")
    # concat_ws builds the text in one pass (no NULL reaches it, so nothing is skipped): the
    # same text as chained ``||``, without an intermediate string per column.
    canonical = f"concat_ws('{SEPARATOR}', {', '.join(parts)})"
    return f"(('x' || substr(md5({canonical}), 1, 8))::bit(32)::bigint)"


def spark_row_hash(source: SourceTable) -> Any:
    """The same hash as a Spark Column over the exported (Parquet) columns."""
    from pyspark.sql import functions as F

    parts = []
    for name, kind in source.columns:
        column = F.col(name)
        text = F.unix_micros(column).cast("string") if kind == "ts" else column.cast("string")
        parts.append(F.coalesce(text, F.lit(NULL_MARK)))
    canonical = F.concat_ws(SEPARATOR, *parts)
    return F.conv(F.substring(F.md5(canonical), 1, 8), 16, 10).cast("bigint")
