"""The row hash of an export, computed in Python: over PostgreSQL's text of the rows read and
over the Parquet files written.

A row's hash is the first 8 hex digits of ``md5`` over its canonical text: every column's
text (integers in decimal, timestamps as epoch microseconds, JSON as PostgreSQL prints it)
joined by ``|``, ``\\N`` for NULL. :mod:`columns` builds the same text in SQL (prune checks it
as it deletes) and in Spark; a range's checksum is the sum of its rows' hashes.

Kept light (no Django, no pyspark): Spark's Python workers import it, and the hashing runs
there, at the export's own priority, rather than inside PostgreSQL.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Iterable
from typing import Any

NULL_MARK = "\\N"
SEPARATOR = "|"


def row_hash(canonical: bytes) -> int:
    """The 32-bit hash of one row's canonical text (UTF-8), as an unsigned int."""
    return int.from_bytes(hashlib.md5(canonical).digest()[:4], "big")


def checksum(canonical_rows: Iterable[bytes]) -> tuple[int, int]:
    """(rows, sum of their hashes)."""
    rows = total = 0
    for canonical in canonical_rows:
        rows += 1
        total += row_hash(canonical)
    return rows, total


def csv_checksum(data: bytes) -> tuple[int, int]:
    """(rows, checksum) of ``COPY ... TO STDOUT (FORMAT csv, NULL '\\N')`` output.

    The CSV is read with Python's own parser, apart from the one that builds the Parquet
    files, so the two checksums compare two independent readings of the same text. The
    canonical text needs no NULL/empty distinction beyond the CSV's: NULL is ``\\N`` there
    (a text equal to ``\\N`` is quoted by PostgreSQL and hashes alike, as in SQL).
    """
    reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""))
    return checksum(SEPARATOR.join(fields).encode("utf-8") for fields in reader)


def arrow_checksum(table: Any, columns: Iterable[tuple[str, str]]) -> tuple[int, int]:
    """(rows, checksum) of an Arrow table with the export's columns (read back from Parquet)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return 0, 0
    texts = []
    for name, kind in columns:
        column = table[name]
        if kind == "ts":
            column = pc.cast(column, pa.int64())
        texts.append(pc.fill_null(pc.cast(column, pa.string()), NULL_MARK))
    joined = pc.binary_join_element_wise(*texts, SEPARATOR)
    return checksum(pc.cast(joined, pa.binary()).to_pylist())
