"""A manifest under ``<destination>/_committed/`` is checked against what the exporter writes
before any path it names is read or deleted; file modes that let others write are refused."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_pgqueue.exceptions import BadManifest, PipelineError
from django_pgqueue.pipeline.commit import LocalCommitter
from django_pgqueue.pipeline.committed import Manifest, read_committed
from django_pgqueue.pipeline.compact import compact
from django_pgqueue.pipeline.export import check_file_mode

GOOD_FILE = "queue=q1/day=2026-10-01/id_range=0/part-0f3a-0.zstd.parquet"


def manifest(lo: int = 0, hi: int = 100, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "format": 1,
        "source": "archive",
        "lo": lo,
        "hi": hi,
        "rows": 1,
        "checksum": 7,
        "run": 1,
        "files": [{"path": GOOD_FILE, "rows": 1, "bytes": 10, "sha256": "ab" * 32}],
    }
    body.update(changes)
    return body


def plant(destination: Path, name: str, body: Any, source: str = "archive") -> Path:
    directory = destination / "_committed" / source
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


def listing(path: str) -> dict[str, Any]:
    return manifest(files=[{"path": path, "rows": 1, "bytes": 10, "sha256": "ab" * 32}])


def test_a_manifest_as_the_exporter_writes_it_is_read(tmp_path: Path) -> None:
    plant(tmp_path, "0-100.json", manifest())
    assert read_committed(str(tmp_path), "archive") == [f"{tmp_path}/archive/{GOOD_FILE}"]


@pytest.mark.parametrize(
    ("name", "body", "problem"),
    [
        ("0-100.json", listing("../../somefile"), "'../../somefile' is not a file"),
        ("0-100.json", listing("queue=q/day=d/id_range=0/../../../x"), "is not a file"),
        ("0-100.json", listing("/etc/passwd"), "'/etc/passwd' is not a file"),
        ("0-100.json", listing("queue=q/part-1.parquet"), "is not a file"),
        ("0-100.json", listing("queue=q/day=d/id_range=50/part-1.parquet"), "is not a file"),
        ("0-100.json", listing("queue=q/day=d/id_range=0/.pgq-tmp-part-1.parquet"), "not a file"),
        ("0-100.json", listing("queue=q/day=d/id_range=0/part-1.csv"), "is not a file"),
        ("0-100.json", listing("queue=q/day=d/id_range=0/part-1\\..\\x.parquet"), "not a file"),
        ("0-100.json", listing("queue=q\x00/day=d/id_range=0/part-1.parquet"), "not a file"),
        ("0-200.json", manifest(), "its name is not 0-100.json"),
        ("evil.json", manifest(), "its name is not 0-100.json"),
        ("0-100.json", manifest(source="dead"), "source 'dead'"),
        ("0-100.json", manifest(format=2), "format"),
        ("100-100.json", manifest(lo=100), "range"),
        ("0-100.json", manifest(files="queue=q"), "not a manifest"),
        ("0-100.json", manifest(rows=-1), "not a manifest"),
        ("0-100.json", "not json", "not a manifest"),
        ("0-100.json", [1, 2], "not a manifest"),
    ],
)
def test_a_manifest_unlike_the_exporters_is_refused_naming_it(
    tmp_path: Path, name: str, body: Any, problem: str
) -> None:
    planted = plant(tmp_path, name, body)
    with pytest.raises(BadManifest, match=str(planted)) as refused:
        read_committed(str(tmp_path), "archive")
    assert problem in str(refused.value)


@pytest.mark.django_db(transaction=True)
def test_compact_refuses_a_planted_manifest_and_deletes_nothing(tmp_path: Path) -> None:
    destination = tmp_path / "export" / "out"
    outside = tmp_path / "somefile"
    outside.write_text("not the export's")
    (destination / "archive").mkdir(parents=True)
    # A covering manifest makes compaction delete the files of the manifests it covers.
    cover = plant(destination, "0-100.json", manifest(files=[]))
    planted = plant(destination, "0-50.json", {**listing("../../../somefile"), "hi": 50})

    with pytest.raises(BadManifest, match=f"{planted}.*'../../../somefile' is not a file"):
        compact(str(destination), sources=["archive"])

    assert outside.read_text() == "not the export's"
    assert cover.exists() and planted.exists()


@pytest.mark.django_db(transaction=True)
def test_the_command_names_the_refused_manifest_in_one_line(tmp_path: Path) -> None:
    destination = tmp_path / "out"
    planted = plant(destination, "0-100.json", listing("/etc/passwd"), source="dead")
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("pgq_pipeline", "compact", str(destination), stderr=err)
    assert err.getvalue().startswith(f"error: The export manifest {planted} is refused")
    assert "Traceback" not in err.getvalue()


@pytest.mark.parametrize("mode", [0o666, 0o664, 0o660, 0o620, 0o602, 0o622])
def test_file_modes_letting_the_group_or_others_write_are_refused(mode: int) -> None:
    with pytest.raises(PipelineError, match=f"file mode {mode:o} .*group or others write"):
        check_file_mode(mode)


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644, 0o604])
def test_file_modes_others_may_read_are_accepted(mode: int) -> None:
    assert check_file_mode(mode) == mode


@pytest.mark.django_db(transaction=True)
def test_compact_refuses_a_world_writable_mode_before_touching_the_destination(
    tmp_path: Path,
) -> None:
    with pytest.raises(PipelineError, match="file mode 666"):
        compact(str(tmp_path / "missing"), sources=["archive"], file_mode=0o666)


def test_the_command_refuses_a_world_writable_mode_as_bad_usage(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="file mode 666 lets the group or others write"):
        call_command("pgq_pipeline", "compact", str(tmp_path), "--file-mode", "666")


@pytest.mark.parametrize("linked", [1, 2, 3])
def test_leftover_cleaning_never_follows_a_symbolic_link_out_of_the_export(
    tmp_path: Path, linked: int
) -> None:
    # queue=, day= or id_range= directory a link to elsewhere, holding a range's file there.
    levels = ["queue=q1", "day=2026-10-01", "id_range=0"]
    elsewhere = tmp_path / "elsewhere"
    precious = elsewhere.joinpath(*levels[linked:], "part-precious.parquet")
    precious.parent.mkdir(parents=True)
    precious.write_text("not the export's")
    link = tmp_path.joinpath("out", "archive", *levels[:linked])
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere)
    committer = LocalCommitter(str(tmp_path / "out"), 0o600)

    assert committer.clean_leftovers("archive", [(0, 100)]) == 0
    assert precious.exists()


@pytest.mark.parametrize("step", ["commit", "clean_leftovers"])
def test_the_exports_own_steps_refuse_a_planted_manifest_before_deleting(
    tmp_path: Path, step: str
) -> None:
    # Re-exporting a range reads its manifest, then deletes the files it listed (commit) or
    # the range's files it does not list (clean_leftovers).
    destination = tmp_path / "export" / "out"
    (destination / "archive").mkdir(parents=True)
    outside = tmp_path / "somefile"
    outside.write_text("not the export's")
    planted = plant(destination, "0-100.json", listing("../../../somefile"))
    committer = LocalCommitter(str(destination), 0o600)

    with pytest.raises(BadManifest, match=str(planted)):
        if step == "commit":
            committer.commit(Manifest("archive", 0, 100, rows=0, checksum=0, run=2), [])
        else:
            committer.clean_leftovers("archive", [(0, 100)])

    assert outside.read_text() == "not the export's" and planted.exists()
