"""The commit record of an export, and how to read only committed data.

A range's Parquet files are written under hidden temporary names (``.pgq-tmp-*``, which Spark,
pyarrow and DuckDB skip), renamed once the range is verified, and made part of the export by
one manifest per range, written atomically (temporary name, then rename) under
``<destination>/_committed/<source>/<lo>-<hi>.json``. The manifest lists the range's files
with their rows, bytes and SHA-256, and the range's row count and checksum; a range holding no
rows has a manifest with no files. Files no manifest lists (a killed run's) are not part of
the export, and the next run deletes them.

Readers that must never see a half-written export use :func:`read_committed` (the file list)
or :func:`read_committed_arrow` / :func:`read_committed_spark`. This module needs neither
Django nor pyspark, so it works on any machine that can read the files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote, urlsplit

from ..exceptions import BadManifest, PipelineError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

COMMITTED_DIR = "_committed"
TEMP_PREFIX = ".pgq-tmp-"
SOURCE_NAMES = ("archive", "dead")
MANIFEST_FORMAT = 1
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class CommittedFile:
    path: str  # relative to the source's directory, e.g. queue=q/day=d/id_range=0/part-x.parquet
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    source: str
    lo: int
    hi: int
    rows: int
    checksum: int
    run: int
    files: tuple[CommittedFile, ...] = field(default_factory=tuple)
    format: int = MANIFEST_FORMAT

    @property
    def name(self) -> str:
        return manifest_name(self.lo, self.hi)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """The manifest in ``data``; ValueError (or TypeError, KeyError) for anything else.
        Its paths are checked by :func:`load_manifest`."""
        body = json.loads(data)
        files = body["files"]
        if not isinstance(files, list):
            raise ValueError("files is not a list")
        return cls(
            source=_text(body["source"]),
            lo=_count(body["lo"]),
            hi=_count(body["hi"]),
            rows=_count(body["rows"]),
            checksum=_whole(body["checksum"]),
            run=_whole(body["run"]),
            files=tuple(
                CommittedFile(
                    path=_text(f["path"]),
                    rows=_count(f["rows"]),
                    bytes=_count(f["bytes"]),
                    sha256=_sha256(f["sha256"]),
                )
                for f in files
            ),
            format=_whole(body.get("format")),
        )


def _whole(value: Any) -> int:
    if type(value) is not int:
        raise ValueError(f"{value!r} is not a whole number")
    return value


def _count(value: Any) -> int:
    if _whole(value) < 0:
        raise ValueError(f"{value!r} is negative")
    return int(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not text")
    return value


def _sha256(value: Any) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise ValueError(f"{value!r} is not a SHA-256 in hex")
    return value


def manifest_name(lo: int, hi: int) -> str:
    return f"{lo}-{hi}.json"


def load_manifest(store: ManifestSource, source: str, name: str) -> Manifest:
    """The manifest ``name`` of ``source``, refused (:class:`BadManifest`) unless it is one the
    exporter could have written: anyone who can write under the destination can plant one, and
    its file paths are read and deleted."""
    path = f"{manifest_dir(store, source)}/{name}"
    try:
        manifest = Manifest.from_json(store.read_bytes(path))
        problem = manifest_problem(manifest, source, name)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        problem = f"it is not a manifest ({type(exc).__name__}: {exc})"
    if problem is not None:
        raise BadManifest(
            f"The export manifest {path} is refused: {problem}. Nothing it lists was read or "
            "deleted; move it out of the destination (this pipeline did not write it) and "
            "check who can write there."
        )
    return manifest


def manifest_problem(manifest: Manifest, source: str, name: str) -> str | None:
    """Why ``manifest`` (found as ``name`` in ``source``'s directory) is not the exporter's."""
    if manifest.format != MANIFEST_FORMAT:
        return f"its format is {manifest.format!r}, not {MANIFEST_FORMAT}"
    if manifest.source != source:
        return f"it names source {manifest.source!r} but is in {source!r}'s directory"
    if not 0 <= manifest.lo < manifest.hi:
        return f"[{manifest.lo}, {manifest.hi}) is not an id range"
    if name != manifest.name:
        return f"its name is not {manifest.name} (its range)"
    for committed in manifest.files:
        if not file_path_is_exported(committed.path, manifest.lo):
            return (
                f"{committed.path!r} is not a file the export writes for this range "
                f"(queue=<queue>/day=<day>/id_range={manifest.lo}/part-<name>.parquet)"
            )
    return None


def file_path_is_exported(path: str, lo: int) -> bool:
    """Whether ``path`` has exactly the layout the exporter writes for the range from ``lo``:
    relative, four plain names, none of them ``.`` or ``..``."""
    if "\\" in path or "\x00" in path:
        return False
    parts = path.split("/")
    if len(parts) != 4 or any(part in ("", ".", "..") for part in parts):
        return False
    queue, day, id_range, name = parts
    return (
        len(queue) > len("queue=")
        and queue.startswith("queue=")
        and len(day) > len("day=")
        and day.startswith("day=")
        and id_range == f"id_range={lo}"
        and name.startswith("part-")
        and name.endswith(".parquet")
    )


def local_directory(url: str) -> str | None:
    """The local directory ``url`` names (a plain path or ``file://``), else None."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        return os.path.abspath(unquote(parts.path))
    if parts.scheme == "" or (len(parts.scheme) == 1 and os.name == "nt"):
        return os.path.abspath(url)
    return None


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class ManifestSource(Protocol):
    """Where manifests are listed and read from: a store, or an export's committer."""

    @property
    def root(self) -> str: ...
    def list_names(self, directory: str) -> list[str]: ...
    def read_bytes(self, path: str) -> bytes: ...


class Store(ManifestSource, Protocol):
    """The few file operations manifests need, on a local disk or through pyarrow.fs."""

    def exists(self, path: str) -> bool: ...
    def size(self, path: str) -> int: ...
    def sha256(self, path: str) -> str: ...


class LocalStore:
    def __init__(self, root: str) -> None:
        self.root = root

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list_names(self, directory: str) -> list[str]:
        try:
            return os.listdir(directory)
        except FileNotFoundError:
            return []

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as stream:
            return stream.read()

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def sha256(self, path: str) -> str:
        return file_sha256(path)

    def write_atomic(self, path: str, data: bytes, mode: int) -> None:
        """Write ``data`` to ``path`` so that a reader sees all of it or nothing."""
        directory = os.path.dirname(path)
        make_dirs(directory, mode)
        temp = os.path.join(directory, f"{TEMP_PREFIX}{os.path.basename(path)}")
        descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp, path)

    def delete(self, path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


class ArrowStore:
    """Any URL pyarrow can open (``s3://``, ``gs://``, ``hdfs://``; ``s3a://`` read as s3)."""

    def __init__(self, url: str) -> None:
        from pyarrow import fs

        parts = urlsplit(url)
        if parts.scheme in {"s3a", "s3n"}:
            url = "s3" + url[len(parts.scheme) :]
        self.fs, self.root = fs.FileSystem.from_uri(url)

    def _path(self, path: str) -> str:
        return path

    def exists(self, path: str) -> bool:
        from pyarrow import fs

        return self.fs.get_file_info(path).type != fs.FileType.NotFound

    def list_names(self, directory: str) -> list[str]:
        from pyarrow import fs

        selector = fs.FileSelector(directory, allow_not_found=True)
        return [info.base_name for info in self.fs.get_file_info(selector)]

    def read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as stream:
            return bytes(stream.read())

    def size(self, path: str) -> int:
        return int(self.fs.get_file_info(path).size)

    def sha256(self, path: str) -> str:
        digest = hashlib.sha256()
        with self.fs.open_input_stream(path) as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()


def open_store(destination: str) -> Store:
    directory = local_directory(destination.rstrip("/"))
    if directory is not None:
        return LocalStore(directory)
    return ArrowStore(destination.rstrip("/"))


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


def check_file_mode(mode: int) -> int:
    """Files stay readable and writable by their owner, are never executable, and only the
    owner may write: whoever can write in the export can plant files and manifests in it."""
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


def directory_mode(file_mode: int) -> int:
    """Search permission wherever read permission is given: 0600 -> 0700, 0640 -> 0750."""
    return file_mode | ((file_mode & 0o444) >> 2)


def manifest_dir(store: ManifestSource, source: str) -> str:
    return f"{store.root}/{COMMITTED_DIR}/{source}"


def committed_manifests(
    store: ManifestSource, source: str, *, include_covered: bool = False
) -> list[Manifest]:
    """The committed manifests of ``source``, in id order.

    A manifest whose ids another one covers was replaced by a compaction (which deletes it
    right after committing the covering one): it is left out, so its rows are read once.
    """
    directory = manifest_dir(store, source)
    manifests = sorted(
        (
            load_manifest(store, source, name)
            for name in store.list_names(directory)
            if name.endswith(".json") and not name.startswith((".", "_"))
        ),
        key=lambda m: (m.lo, -m.hi),
    )
    if include_covered:
        return manifests
    kept: list[Manifest] = []
    for manifest in manifests:  # sorted by lo, widest first: a covered one follows its cover
        if kept and kept[-1].lo <= manifest.lo and manifest.hi <= kept[-1].hi:
            continue
        kept.append(manifest)
    return kept


def _sources(source: str | None) -> Iterable[str]:
    if source is None:
        return SOURCE_NAMES
    if source not in SOURCE_NAMES:
        raise ValueError(f"Unknown export source {source!r}; use archive or dead.")
    return (source,)


def read_committed(destination: str, source: str | None = None) -> list[str]:
    """Paths (or URLs) of the committed Parquet files of an export, in id order.

    ``source`` is ``"archive"``, ``"dead"`` or None for both. Files being written, or left by
    a killed run, are never listed. Each path ends in ``queue=/day=/id_range=`` directories:
    give readers the source directory as base path to get those columns.
    """
    destination = destination.rstrip("/")
    store = open_store(destination)
    base = destination if local_directory(destination) is None else store.root
    return [
        f"{base}/{name}/{committed.path}"
        for name in _sources(source)
        for manifest in committed_manifests(store, name)
        for committed in manifest.files
    ]


def read_committed_arrow(destination: str, source: str) -> Any:
    """A ``pyarrow.dataset.Dataset`` over the committed files of ``source`` (hive columns)."""
    import pyarrow.dataset as ds

    files = read_committed(destination, source)
    store = open_store(destination)
    filesystem = store.fs if isinstance(store, ArrowStore) else None
    if filesystem is not None:
        files = [ArrowStore(path).root for path in files]
    return ds.dataset(
        files,
        schema=reader_schema(source) if not files else None,
        format="parquet",
        filesystem=filesystem,
        partitioning=ds.partitioning(flavor="hive"),
        partition_base_dir=f"{store.root}/{source}",
    )


def read_committed_spark(spark: SparkSession, destination: str, source: str) -> DataFrame:
    """A Spark DataFrame over the committed files of ``source`` (queue, day, id_range as text)."""
    destination = destination.rstrip("/")
    files = read_committed(destination, source)
    if not files:
        from pyspark.sql.pandas.types import from_arrow_schema

        return spark.createDataFrame([], from_arrow_schema(reader_schema(source)))
    spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    return spark.read.option("basePath", f"{destination}/{source}").parquet(*files)


def reader_schema(source: str) -> Any:
    """The Arrow schema readers see: the exported columns plus ``day`` and ``id_range``."""
    import pyarrow as pa

    try:
        from .columns import SOURCES
    except Exception:  # Django not configured on a reader's machine
        return pa.schema([])
    schema = arrow_schema(SOURCES[source].columns)
    return schema.append(pa.field("day", pa.string())).append(pa.field("id_range", pa.string()))


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
