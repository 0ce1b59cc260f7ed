"""An export's Delta Lake tables: where they are, their schema, and what a version holds.

Each source (``archive``, ``dead``) is one Delta table, ``<destination>/<source>``, partitioned
by ``queue``, ``day`` (the UTC day of ``finished_at`` / ``died_at``) and ``id_range`` (the
first id of the export range that wrote the file). Any Delta reader (deltalake, Polars,
DuckDB over deltalake's dataset, Spark with Delta) sees committed data only, and older versions.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from ..exceptions import ForeignTableEntry, PipelineError

if TYPE_CHECKING:
    from deltalake import DeltaTable

SOURCE_NAMES = ("archive", "dead")
PARTITION_COLUMNS = ("queue", "day", "id_range")


def local_directory(url: str) -> str | None:
    """The local directory ``url`` names (a plain path or ``file://``), else None."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        return os.path.abspath(unquote(parts.path))
    if parts.scheme == "" or (len(parts.scheme) == 1 and os.name == "nt"):
        return os.path.abspath(url)
    return None


def check_file_mode(mode: int) -> int:
    """Files stay readable and writable by their owner, are never executable, and only the
    owner may write: whoever can write in the export can plant files and commits in it."""
    if not 0 <= mode <= 0o777 or mode & 0o600 != 0o600 or mode & 0o111:
        raise PipelineError(
            f"file mode {mode:o} is not a file permission with owner read/write and no execute "
            "bits (e.g. 600, 640, 644)."
        )
    if mode & 0o022:
        raise PipelineError(
            f"file mode {mode:o} lets the group or others write to the export; use one only "
            "the owner may write (e.g. 600, 640, 644)."
        )
    return mode


def table_uri(destination: str, source: str) -> str:
    """The Delta table of ``source`` as delta-rs opens it (``s3a://`` is ``s3://`` there)."""
    destination = destination.rstrip("/")
    directory = local_directory(destination)
    if directory is not None:
        return f"{directory}/{source}"
    scheme = urlsplit(destination).scheme
    if scheme in {"s3a", "s3n"}:
        destination = "s3" + destination[len(scheme) :]
    return f"{destination}/{source}"


def open_table(destination: str, source: str, version: int | None = None) -> DeltaTable | None:
    """The Delta table of ``source`` (its latest version, or ``version``), None if there is none.

    Object-store credentials come from the environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``),
    as delta-rs reads them.
    """
    from deltalake import DeltaTable

    uri = table_uri(destination, source)
    if not DeltaTable.is_deltatable(uri):
        return None
    return DeltaTable(uri, version=version)


#: Where the export writes a data file, relative to its table: no ``..``, no other directory.
_FILE_PATH = re.compile(
    r"queue=[a-z0-9][a-z0-9_-]*/day=\d{4}-\d{2}-\d{2}/id_range=\d+/[\w.-]+\.parquet"
)


@dataclass(frozen=True)
class TableFile:
    """One data file of a table version: its path relative to the table, as the log has it."""

    path: str
    bytes: int
    rows: int | None
    id_range: int


def table_files(table: DeltaTable) -> list[TableFile]:
    """The data files of the table's loaded version (its add actions)."""
    # Read column by column as delta-rs returns them (no pyarrow import: a no-op export
    # decides with this alone).
    actions = table.get_add_actions(flatten=True)
    if not actions.num_rows:
        return []
    paths, sizes, rows, ranges = (
        actions.column(name).to_pylist()
        for name in ("path", "size_bytes", "num_records", "partition.id_range")
    )
    files = [
        TableFile(unquote(p), int(b), None if n is None else int(n), int(r))
        for p, b, n, r in zip(paths, sizes, rows, ranges, strict=True)
    ]
    for f in files:
        if not _FILE_PATH.fullmatch(f.path) or f"/id_range={f.id_range}/" not in f.path:
            raise ForeignTableEntry(
                f"the Delta table at {table.table_uri} lists {f.path!r}, not a file the export "
                "writes (queue=<queue>/day=<day>/id_range=<lo>/<name>.parquet): nothing of it is "
                "read or deleted; find out who could write to the table."
            )
    return files


def files_by_range(table: DeltaTable | None) -> dict[int, list[TableFile]]:
    found: dict[int, list[TableFile]] = {}
    for f in table_files(table) if table is not None else []:
        found.setdefault(f.id_range, []).append(f)
    return found


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def make_dirs(directory: str, mode: int) -> None:
    """``os.makedirs`` whose new directories get ``mode``'s directory form (0600 -> 0700)."""
    mode = directory_mode(mode)
    missing = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for path in reversed(missing):  # every level, not only the last (os.makedirs' rule)
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            continue
        os.chmod(path, mode)  # whatever the process umask is


def directory_mode(file_mode: int) -> int:
    """Search permission wherever read permission is given: 0600 -> 0700, 0640 -> 0750."""
    return file_mode | ((file_mode & 0o444) >> 2)


@contextmanager
def file_mode_umask(file_mode: int) -> Iterator[None]:
    """Files and directories created meanwhile (Delta's log included) get ``file_mode``."""
    previous = os.umask(0o777 & ~directory_mode(file_mode))
    try:
        yield
    finally:
        os.umask(previous)


#: Arrow type of each non-text column kind; integer widths follow the PostgreSQL columns so
#: files match the ones Spark's JDBC path writes (smallint -> int16, integer -> int32).
INT_WIDTHS = {"priority": 16, "attempts": 32, "max_attempts": 32}


def arrow_schema(columns: Iterable[tuple[str, str]]) -> Any:
    import pyarrow as pa

    fields = []
    for name, kind in columns:
        if kind == "ts":
            fields.append(pa.field(name, pa.timestamp("us", tz="UTC")))
        elif kind == "int":
            fields.append(pa.field(name, getattr(pa, f"int{INT_WIDTHS.get(name, 64)}")()))
        else:
            fields.append(pa.field(name, pa.string()))
    return pa.schema(fields)


def table_schema(columns: Iterable[tuple[str, str]]) -> Any:
    """The table's schema: the exported columns, then ``day`` and ``id_range`` (partitions)."""
    import pyarrow as pa

    schema = arrow_schema(columns)
    return schema.append(pa.field("day", pa.date32())).append(pa.field("id_range", pa.int64()))
