"""Operating the export and prune: what they wait for, what they say, what they refuse early.

No Spark session here: these are the paths that must not need one.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from django_pgqueue.pipeline import cli
from django_pgqueue.pipeline.columns import ARCHIVE
from django_pgqueue.pipeline.export import safe_horizon
from django_pgqueue.pipeline.prune import PruneResult, _vacuum

from .conftest import fill_archive

pytestmark = [pytest.mark.django_db(transaction=True)]


def _dsn(dbname: str | None = None) -> str:
    s = connection.settings_dict
    return (
        f"host={s['HOST'] or '127.0.0.1'} port={s['PORT'] or 5432} user={s['USER']} "
        f"dbname={dbname or s['NAME']}"
    )


def test_horizon_wait_ignores_transactions_of_other_databases() -> None:
    fill_archive(10)
    with psycopg.connect(_dsn("postgres")) as elsewhere:
        elsewhere.execute("SELECT txid_current()")  # holds a transaction id, stays open
        with psycopg.connect(_dsn("postgres"), autocommit=True) as later:
            later.execute("SELECT txid_current()")  # a later one ends: the open one is in xip
        started = time.monotonic()
        horizon, waited = safe_horizon(ARCHIVE, "default", wait=5.0)
        assert waited == [] and time.monotonic() - started < 4
        elsewhere.rollback()
    assert horizon == ArchivedMax() + 1


def test_horizon_wait_still_waits_for_transactions_of_this_database() -> None:
    fill_archive(10)
    with psycopg.connect(_dsn()) as here:
        here.execute("SELECT txid_current()")
        _, waited = safe_horizon(ARCHIVE, "default", wait=0.5)
        here.rollback()
    assert len(waited) == 1 and "still running" in waited[0]


def ArchivedMax() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id) FROM pgqueue_archive")
        return int(cursor.fetchone()[0])


def test_vacuum_by_a_role_that_does_not_own_the_tables_is_reported_skipped() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgq_not_owner') "
            "THEN CREATE ROLE pgq_not_owner; END IF; END $$"
        )
        cursor.execute("GRANT SELECT, DELETE ON pgqueue_archive, pgqueue_dead TO pgq_not_owner")
        cursor.execute("SET ROLE pgq_not_owner")
        try:
            skipped = _vacuum([ARCHIVE], "default")
        finally:
            cursor.execute("RESET ROLE")
    assert len(skipped) == 1 and "only its owner" in skipped[0]
    assert _vacuum([ARCHIVE], "default") == []  # the owner does vacuum


def test_prune_reports_a_dry_run_as_one_and_a_skipped_vacuum() -> None:
    dry = PruneResult(destination="/d", dry_run=True, rows=1200, ranges_pruned=3)
    text = cli.prune_text(dry)
    assert text.startswith("dry run, nothing deleted: would prune 1,200 rows in 3 ranges")
    assert "pruned 1,200" not in text and "rows/s" not in text
    none = cli.prune_text(PruneResult(destination="/d", refused=["archive [0, 10): gone"]))
    assert none.startswith("pruned nothing") and "refused 1 ranges" in none
    skipped = PruneResult(destination="/d", rows=5, ranges_pruned=1, vacuum_skipped=["t: x"])
    assert "vacuum skipped: t: x" in cli.prune_text(skipped)


def test_a_bad_database_url_is_one_line_at_once_and_creates_no_destination(
    tmp_path: Path,
) -> None:
    from django.conf import settings

    repo = Path(settings.REPO_DIR)
    destination = tmp_path / "out"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings"),
        "DATABASE_URL": "postgres://postgres@127.0.0.1:1/nowhere",
        "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "example_project"), *sys.path]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "django_pgqueue.pipeline", "export", str(destination)],
        cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot connect to database"), lines
    assert "127.0.0.1:1/nowhere" in lines[0]
    assert not destination.exists()


def test_export_with_nothing_new_decides_so_without_starting_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_archive(30)
    import pyarrow
    import pyarrow.parquet

    from django_pgqueue.pipeline.commit import LocalCommitter, WrittenFile
    from django_pgqueue.pipeline.models import ExportRange, ExportRun

    destination = tmp_path / "out"
    run = ExportRun.objects.create(destination=str(destination), status="completed")
    lo, hi = ArchivedMax() - 29, ArchivedMax() + 1
    ExportRange.objects.create(
        run=run, destination=str(destination), source="archive", lo=lo, hi=hi,
        status="verified", source_rows=30, source_checksum=_checksum(lo, hi), parquet_rows=30,
    )  # fmt: skip
    # The range's file, committed to the archive's Delta table.
    part = destination / "archive" / "queue=q0" / "day=2026-10-01" / f"id_range={lo}" / "p.parquet"
    part.parent.mkdir(parents=True)
    pyarrow.parquet.write_table(pyarrow.table({"id": list(range(lo, hi))}), part)
    written = WrittenFile(str(part), 30, part.stat().st_size, "")
    LocalCommitter(str(destination), 0o600).commit(ARCHIVE, run.pk, {}, [written], [])

    def no_spark(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Spark started for an export with nothing to do")

    monkeypatch.setattr("django_pgqueue.pipeline.session.build_session", no_spark)
    out, err = io.StringIO(), io.StringIO()
    options = {"job": "export", "destination": str(destination), "source": ["archive"]}

    assert cli.run(options, out, err) == 0
    assert "nothing new to export" in out.getvalue()
    fill_archive(1)  # one new row: now there is work, and Spark is needed
    with pytest.raises(AssertionError, match="Spark started"):
        cli.run(options, out, err)


def _checksum(lo: int, hi: int) -> int:
    from django_pgqueue.pipeline.export import source_figures

    return source_figures(ARCHIVE, lo, hi, "default")[1]
