"""Export side of the Delta tables: commit a range's files, or a compaction, in one commit.

The files of a range are written under their final names in the range's ``id_range=<lo>``
partition; they are part of the export once the driver, holding the destination's lease, has
committed them to the source's Delta table: one commit with an add action per file (its size
and row count) and a remove action for each file an earlier commit of the same range holds.
The commit carries the range's bounds, row count and checksum (``pgqueue`` in its commit
info) and an application transaction (``txn``) of app id :data:`APP_ID` with the run's id as
version. Two writers racing their commits cannot both win: delta-rs's conflict check fails a
commit when a concurrent one carried the same app id. A run older than the table's last
committing run refuses to commit (it lost the destination to that run).

Files written by a killed run are in no version: :meth:`Committer.remove_untracked` deletes
those of the ranges to redo before the next run writes them again. Two implementations of the
file operations: plain ``os`` calls for a local path, Hadoop's FileSystem (through the JVM)
for other URLs, which Spark's writer writes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..exceptions import LeaseLost, PipelineError
from .columns import SourceTable, spark_row_hash
from .committed import (
    PARTITION_COLUMNS,
    TableFile,
    directory_mode,
    file_mode_umask,
    local_directory,
    make_dirs,
    open_table,
    table_files,
    table_schema,
    table_uri,
)

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession

#: The application transaction id of every commit of an export (its version: the run's id).
APP_ID = "django_pgqueue.pipeline"


@dataclass(frozen=True)
class WrittenFile:
    """A data file written for a commit: full path (or URL), rows, bytes, SHA-256."""

    path: str
    rows: int
    bytes: int
    sha256: str


class Committer:
    """The Delta tables of one destination; subclasses say how files are reached."""

    def __init__(self, destination: str, file_mode: int) -> None:
        self.destination = destination.rstrip("/")
        self.file_mode = file_mode
        self._tables: dict[str, DeltaTable] = {}

    # -- file operations (paths are full paths or URLs) --
    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def delete(self, path: str) -> None:
        raise NotImplementedError

    def source_root(self, source: str) -> str:
        return f"{self.destination}/{source}"

    def relative(self, source: str, path: str) -> str:
        return path[len(self.source_root(source)) + 1 :]

    # -- the tables --
    def table(self, source: SourceTable) -> DeltaTable:
        """The source's table at its latest version, created (empty) if there is none."""
        from deltalake import DeltaTable

        table = self._tables.get(source.name)
        if table is None:
            with file_mode_umask(self.file_mode):
                table = open_table(self.destination, source.name) or DeltaTable.create(
                    table_uri(self.destination, source.name),
                    table_schema(source.columns),
                    partition_by=list(PARTITION_COLUMNS),
                    name=f"pgqueue_{source.name}",
                    description=f"django_pgqueue export of {source.table}",
                )
            self._tables[source.name] = table
        else:
            table.update_incremental()
        return table

    def commit(
        self,
        source: SourceTable,
        run_id: int,
        info: dict[str, Any],
        added: Iterable[WrittenFile],
        replaced: Iterable[TableFile],
        data_change: bool = True,
    ) -> int:
        """One Delta commit adding ``added`` and removing ``replaced``; returns its version.

        ``info`` is stored as ``pgqueue`` in the commit info.
        """
        from deltalake import CommitProperties
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction, RemoveAction, Transaction

        table = self.table(source)
        last_run = table.transaction_version(APP_ID)
        if last_run is not None and last_run > run_id:
            raise LeaseLost(
                f"Export run #{run_id} may not commit to {self.destination}: run #{last_run} "
                "has committed to it since (this run lost its lease)."
            )
        now = int(time.time() * 1000)
        actions: list[Any] = [
            RemoveAction(
                quote(old.path, safe="/="), data_change, now, old.bytes, _partition_of(old.path)
            )
            for old in replaced
        ]
        for new in added:
            relative = self.relative(source.name, new.path)
            actions.append(
                AddAction(
                    quote(relative, safe="/="),
                    new.bytes,
                    _partition_of(relative),
                    now,
                    data_change,
                    f'{{"numRecords": {new.rows}}}',
                )
            )
        properties = CommitProperties(
            custom_metadata={"pgqueue": info},
            app_transactions=[Transaction(APP_ID, run_id, now)],
        )
        try:
            with file_mode_umask(self.file_mode):
                table.create_write_transaction(
                    actions, "append", table.schema(), commit_properties=properties
                )
        except CommitFailedError as exc:
            raise LeaseLost(
                f"Export run #{run_id} lost the race to commit to {table.table_uri}: another "
                f"writer committed to the table first ({exc}); nothing of this commit is in it."
            ) from exc
        table.update_incremental()
        return table.version()

    def remove_untracked(self, source: SourceTable, lows: Iterable[int]) -> int:
        """Delete the files of the ``id_range=<lo>`` partitions no version of the table holds
        (what a killed run wrote). Runs under the lease, before anything is written."""
        wanted = {f"id_range={lo}" for lo in lows}
        if not wanted:
            return 0
        table = self.table(source)
        every = set(_vacuum_candidates(table, full=True))
        untracked = every - set(_vacuum_candidates(table, full=False))
        removed = 0
        for relative in sorted(untracked):
            if set(relative.split("/")) & wanted:
                self.delete(f"{self.source_root(source.name)}/{relative}")
                removed += 1
        return removed

    def files_of(self, source: SourceTable, lows: Iterable[int]) -> list[TableFile]:
        """The files the table's latest version holds in these ranges' partitions."""
        lows = set(lows)
        return [f for f in table_files(self.table(source)) if f.id_range in lows]


def _vacuum_candidates(table: DeltaTable, *, full: bool) -> list[str]:
    """What a vacuum would delete now: every file outside the latest version (``full``), or
    only the files removed by a commit (tombstones); nothing is deleted."""
    return [
        str(p)
        for p in table.vacuum(
            retention_hours=0, dry_run=True, enforce_retention_duration=False, full=full
        )
    ]


def _partition_of(relative: str) -> dict[str, str | None]:
    """Partition values from a ``queue=/day=/id_range=`` path."""
    values: dict[str, str | None] = {}
    for part in relative.split("/")[:-1]:
        name, _, value = part.partition("=")
        values[name] = value
    return values


class LocalCommitter(Committer):
    def __init__(self, destination: str, file_mode: int) -> None:
        directory = local_directory(destination)
        assert directory is not None
        super().__init__(directory, file_mode)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def delete(self, path: str) -> None:
        # Never through a symbolic link: what is deleted stays inside the export.
        inside = os.path.realpath(os.path.dirname(path)).startswith(
            os.path.realpath(self.destination) + os.sep
        )
        if not inside or os.path.islink(path):
            raise PipelineError(f"refusing to delete {path}: it is not a file of the export")
        try:
            os.remove(path)
        except FileNotFoundError:
            pass

    def create_root(self) -> None:
        make_dirs(self.destination, self.file_mode)
        os.chmod(self.destination, directory_mode(self.file_mode))


@dataclass(frozen=True)
class StagedFile:
    """A file Spark wrote, moved into its final directory of the table."""

    path: str
    lo: int  # its id_range directory
    rows: int
    bytes: int
    sha256: str
    checksum: int  # sum of the row hashes of its rows (columns.spark_row_hash)


class HadoopCommitter(Committer):
    """For URLs only the JVM can write (``s3a://``, ``hdfs://``...)."""

    def __init__(self, spark: SparkSession, destination: str, file_mode: int) -> None:
        from .session import hadoop_fs

        # Spark's writer (and Hadoop's file system) create files and directories with this
        # umask, so they get the file mode chosen for the export.
        umask = f"{0o777 & ~directory_mode(file_mode):03o}"
        spark.sparkContext._jsc.hadoopConfiguration().set("fs.permissions.umask-mode", umask)
        fs, path = hadoop_fs(spark, destination.rstrip("/"))
        super().__init__(destination, file_mode)
        # Fully qualified (file:/x, s3a://b/x): the form listings return paths in.
        self.qualified = str(fs.makeQualified(path).toString())
        self.spark = spark
        self._fs = fs
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._jvm = jvm

    def source_root(self, source: str) -> str:
        return f"{self.qualified}/{source}"

    def _path(self, path: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(path)

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._path(path)))

    def rename(self, source: str, target: str) -> None:
        if not self._fs.rename(self._path(source), self._path(target)):
            raise OSError(f"could not rename {source} to {target}")

    def delete(self, path: str) -> None:
        self._fs.delete(self._path(path), False)

    def list_files(self, directory: str) -> list[str]:
        """Every file under ``directory``, recursively, as fully qualified paths."""
        path = self._path(directory)
        if not self._fs.exists(path):
            return []
        found, files = [], self._fs.listFiles(path, True)
        while files.hasNext():
            found.append(str(files.next().getPath().toString()))
        return found

    def qualify(self, uri: str) -> str:
        """A path Spark printed (``file:///x``, URL-encoded) in the form listings use."""
        path = self._jvm.org.apache.hadoop.fs.Path(self._jvm.java.net.URI(uri))
        return str(self._fs.makeQualified(path).toString())

    def size(self, path: str) -> int:
        return int(self._fs.getFileStatus(self._path(path)).getLen())

    def delete_tree(self, path: str) -> None:
        self._fs.delete(self._path(path), True)

    def stage(self, source: SourceTable, written_root: str) -> list[StagedFile]:
        """The Parquet files Spark's writer left under ``written_root`` (``queue=/day=/
        id_range=`` directories), each read back through Spark (rows and checksum, SHA-256 of
        its bytes) and moved into the same directory of the source's table; ``written_root``
        is then deleted. They are part of the export once committed."""
        from pyspark.sql import functions as F

        spark = self.spark
        written = [
            p for p in self.list_files(written_root) if p.rsplit("/", 1)[1].startswith("part-")
        ]
        spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        per_file: dict[str, tuple[int, int]] = {}
        hashes: dict[str, str] = {}
        if written:
            read = spark.read.option("basePath", written_root).parquet(*written)
            for row in (
                read.withColumn("file", F.input_file_name())
                .groupBy("file")
                .agg(F.count(F.lit(1)).alias("rows"), F.sum(spark_row_hash(source)).alias("sum"))
                .collect()
            ):
                per_file[self.qualify(row["file"])] = (int(row["rows"]), int(row["sum"] or 0))
            hashes = {
                self.qualify(row["path"]): row["sha"]
                for row in spark.read.format("binaryFile")
                .load(written)
                .select("path", F.sha2("content", 256).alias("sha"))
                .collect()
            }
        staged = []
        root = self.source_root(source.name)
        for path in written:
            relative = path[len(written_root) + 1 :]
            lo = int(relative.split("id_range=", 1)[1].split("/", 1)[0])
            target = f"{root}/{relative}"
            self._fs.mkdirs(self._path(target.rsplit("/", 1)[0]))
            self.rename(path, target)
            rows, checksum = per_file[path]
            staged.append(StagedFile(target, lo, rows, self.size(target), hashes[path], checksum))
        self.delete_tree(written_root)
        return staged
