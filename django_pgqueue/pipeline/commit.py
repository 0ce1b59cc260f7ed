"""Export side of the commit protocol (format and readers: :mod:`committed`).

The driver, holding the destination's lease, commits a verified range in three steps: rename
its files from their hidden temporary names to their final ones, replace the range's manifest
atomically (the commit point for readers), then delete the files of the manifest it replaced.
Only then is the range ``verified`` in PostgreSQL. Whatever a crash leaves between those steps
is either committed (listed by a manifest) or deleted by :meth:`Committer.clean_leftovers`
on the next run, before it writes anything.

Two implementations of the file operations: plain ``os`` calls for a local path (what Spark
tasks wrote with pyarrow), Hadoop's FileSystem through the JVM for other URLs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .columns import SourceTable, spark_row_hash
from .committed import (
    COMMITTED_DIR,
    TEMP_PREFIX,
    CommittedFile,
    LocalStore,
    Manifest,
    directory_mode,
    load_manifest,
    local_directory,
    make_dirs,
    manifest_name,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def final_name(temp_path: str) -> str:
    directory, name = os.path.split(temp_path)
    if not name.startswith(TEMP_PREFIX):
        raise ValueError(f"{temp_path} is not a temporary export file")
    return os.path.join(directory, name[len(TEMP_PREFIX) :])


class Committer:
    """Manifests and files of one destination; subclasses say how files are reached."""

    def __init__(self, destination: str, file_mode: int) -> None:
        self.destination = destination.rstrip("/")
        self.file_mode = file_mode

    @property
    def root(self) -> str:
        return self.destination

    # -- file operations (paths are full paths or URLs) --
    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def list_names(self, directory: str) -> list[str]:
        raise NotImplementedError

    def read_bytes(self, path: str) -> bytes:
        raise NotImplementedError

    def write_atomic(self, path: str, data: bytes) -> None:
        raise NotImplementedError

    def rename(self, source: str, target: str) -> None:
        raise NotImplementedError

    def delete(self, path: str) -> None:
        raise NotImplementedError

    def range_files(self, source: str, lo: int) -> list[str]:
        """Every file (temporary or final) under ``<source>/queue=*/day=*/id_range=<lo>``."""
        raise NotImplementedError

    # -- the protocol --
    def source_root(self, source: str) -> str:
        return f"{self.destination}/{source}"

    def manifest_path(self, source: str, lo: int, hi: int) -> str:
        return f"{self.destination}/{COMMITTED_DIR}/{source}/{manifest_name(lo, hi)}"

    def manifest(self, source: str, lo: int, hi: int) -> Manifest | None:
        directory = f"{self.destination}/{COMMITTED_DIR}/{source}"
        name = manifest_name(lo, hi)
        if name not in self.list_names(directory):
            return None
        return load_manifest(self, source, name)

    def manifest_names(self, source: str) -> set[str]:
        return set(self.list_names(f"{self.destination}/{COMMITTED_DIR}/{source}"))

    def commit(self, manifest: Manifest, renames: Iterable[tuple[str, str]]) -> None:
        """Make ``manifest`` the range's committed state: the one step readers observe."""
        previous = self.manifest(manifest.source, manifest.lo, manifest.hi)
        for temp, final in renames:
            self.rename(temp, final)
        self.write_atomic(
            self.manifest_path(manifest.source, manifest.lo, manifest.hi), (manifest.to_json())
        )
        if previous is not None:
            kept = {f.path for f in manifest.files}
            root = self.source_root(manifest.source)
            for old in previous.files:
                if old.path not in kept:
                    self.delete(f"{root}/{old.path}")

    def clean_leftovers(self, source: str, ranges: Iterable[tuple[int, int]]) -> int:
        """Delete the files of these ranges that their manifest (if any) does not list."""
        removed = 0
        root = self.source_root(source)
        for lo, hi in ranges:
            current = self.manifest(source, lo, hi)
            listed = {f"{root}/{f.path}" for f in current.files} if current else set()
            for path in self.range_files(source, lo):
                if path not in listed:
                    self.delete(path)
                    removed += 1
        return removed

    def relative(self, source: str, path: str) -> str:
        return path[len(self.source_root(source)) + 1 :]

    def committed_file(self, source: str, path: str, rows: int, size: int, sha: str) -> Any:
        return CommittedFile(path=self.relative(source, path), rows=rows, bytes=size, sha256=sha)


class LocalCommitter(Committer):
    def __init__(self, destination: str, file_mode: int) -> None:
        directory = local_directory(destination)
        assert directory is not None
        super().__init__(directory, file_mode)
        self._store = LocalStore(directory)

    def exists(self, path: str) -> bool:
        return self._store.exists(path)

    def list_names(self, directory: str) -> list[str]:
        return self._store.list_names(directory)

    def read_bytes(self, path: str) -> bytes:
        return self._store.read_bytes(path)

    def write_atomic(self, path: str, data: bytes) -> None:
        self._store.write_atomic(path, data, self.file_mode)

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    def delete(self, path: str) -> None:
        self._store.delete(path)

    def range_files(self, source: str, lo: int) -> list[str]:
        found = []
        root = self.source_root(source)
        for queue in _subdirs(root, "queue="):
            for day in _subdirs(queue, "day="):
                directory = f"{day}/id_range={lo}"
                if os.path.islink(directory):
                    continue
                for name in self.list_names(directory):
                    found.append(f"{directory}/{name}")
        return found

    def temp_files(self, source: str) -> list[str]:
        """Every temporary file anywhere under the source (a killed run's, by construction)."""
        found = []
        for directory, _, names in os.walk(self.source_root(source)):
            found += [os.path.join(directory, n) for n in names if n.startswith(TEMP_PREFIX)]
        return found

    def create_root(self) -> None:
        make_dirs(self.destination, self.file_mode)
        os.chmod(self.destination, directory_mode(self.file_mode))


def _subdirs(directory: str, prefix: str) -> list[str]:
    """Subdirectories, never a symbolic link: what is deleted in them stays in the export."""
    try:
        return [
            e.path
            for e in os.scandir(directory)
            if e.is_dir(follow_symlinks=False) and e.name.startswith(prefix)
        ]
    except FileNotFoundError:
        return []


@dataclass(frozen=True)
class StagedFile:
    """A file Spark wrote, moved under its temporary name into its final directory."""

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
        # Fully qualified (file:/x, s3a://b/x): the form listings return paths in.
        super().__init__(str(fs.makeQualified(path).toString()), file_mode)
        self.spark = spark
        self._fs = fs
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._jvm = jvm

    def _path(self, path: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(path)

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._path(path)))

    def list_names(self, directory: str) -> list[str]:
        path = self._path(directory)
        if not self._fs.exists(path):
            return []
        return [status.getPath().getName() for status in self._fs.listStatus(path)]

    def read_bytes(self, path: str) -> bytes:
        stream = self._fs.open(self._path(path))
        try:
            reader = self._jvm.java.io.ByteArrayOutputStream()
            self._jvm.org.apache.hadoop.io.IOUtils.copyBytes(stream, reader, 65536, False)
            return bytes(reader.toByteArray())
        finally:
            stream.close()

    def write_atomic(self, path: str, data: bytes) -> None:
        directory, name = path.rsplit("/", 1)
        temp = self._path(f"{directory}/{TEMP_PREFIX}{name}")
        stream = self._fs.create(temp, True)
        stream.write(bytearray(data))
        stream.close()
        target = self._path(path)
        # Hadoop's rename does not replace: the range is briefly uncommitted, never half.
        if self._fs.exists(target):
            self._fs.delete(target, False)
        if not self._fs.rename(temp, target):
            raise OSError(f"could not rename {temp} to {path}")

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

    def make_dirs(self, directory: str) -> None:
        self._fs.mkdirs(self._path(directory))

    def size(self, path: str) -> int:
        return int(self._fs.getFileStatus(self._path(path)).getLen())

    def delete_tree(self, path: str) -> None:
        self._fs.delete(self._path(path), True)

    def range_files(self, source: str, lo: int) -> list[str]:
        pattern = self._path(f"{self.source_root(source)}/queue=*/day=*/id_range={lo}/*")
        return [str(status.getPath().toString()) for status in self._fs.globStatus(pattern) or []]

    def stage(self, source: SourceTable, written_root: str) -> list[StagedFile]:
        """The Parquet files Spark's writer left under ``written_root`` (``queue=/day=/
        id_range=`` directories), each read back through Spark (rows and checksum, SHA-256 of
        its bytes) and moved under a temporary name into the same directory of the source's
        export; ``written_root`` is then deleted. The commit renames them."""
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
            directory, name = f"{root}/{relative}".rsplit("/", 1)
            target = f"{directory}/{TEMP_PREFIX}{name}"
            self.make_dirs(directory)
            self.rename(path, target)
            rows, checksum = per_file[path]
            staged.append(StagedFile(target, lo, rows, self.size(target), hashes[path], checksum))
        self.delete_tree(written_root)
        return staged


def committer_for(spark: SparkSession | None, destination: str, file_mode: int) -> Committer:
    if local_directory(destination) is not None:
        return LocalCommitter(destination, file_mode)
    if spark is None:
        raise ValueError(f"{destination} can only be written through Spark")
    return HadoopCommitter(spark, destination, file_mode)
