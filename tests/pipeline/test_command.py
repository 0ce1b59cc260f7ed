from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from django_pgqueue.exceptions import MasterUnreachable, SparkUnavailable
from django_pgqueue.models import ArchivedMessage
from django_pgqueue.pipeline.models import QueueStatsHourly
from django_pgqueue.pipeline.session import build_session, check_master

from .conftest import fill_archive

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def test_export_stats_and_prune_through_the_command(spark: Any, tmp_path: Path) -> None:
    fill_archive(600)
    out, err = io.StringIO(), io.StringIO()
    destination = str(tmp_path / "out")

    call_command(
        "pgq_pipeline", "--master", "local[2]", "--json", "export", destination,
        "--range-size", "200", stdout=out, stderr=err,
    )  # fmt: skip

    summary = json.loads(out.getvalue())
    assert summary["rows"] == 600 and summary["verified"] == summary["ranges"] >= 3
    progress = err.getvalue().splitlines()
    assert progress and all("rows/s" in line and "left" in line for line in progress)
    assert "0 left" in progress[-1]
    assert summary["ids_left"] == 0

    call_command(
        "pgq_pipeline", "stats", "--since", "2026-10-01T00:00+00:00",
        "--until", "2026-10-02T00:00+00:00", stdout=out, stderr=err,
    )  # fmt: skip
    assert QueueStatsHourly.objects.exists()

    out = io.StringIO()
    call_command("pgq_pipeline", "prune", "--destination", destination, stdout=out, stderr=err)
    assert "pruned 600 rows" in out.getvalue()
    assert not ArchivedMessage.objects.exists()
    with pytest.raises(CommandError, match="prune failed"):
        call_command("pgq_pipeline", "prune", "--destination", destination, stdout=out, stderr=err)


@pytest.mark.parametrize("max_ranges", ["0", "-1", "two", "1.5"])
def test_max_ranges_takes_a_whole_number_of_at_least_one(max_ranges: str) -> None:
    with pytest.raises(CommandError, match="a whole number >= 1"):
        call_command("pgq_pipeline", "export", "/tmp/x", "--max-ranges", max_ranges)


def test_missing_java_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SparkUnavailable, match="openjdk-17-jre-headless"):
        build_session("local[1]")
    monkeypatch.setenv("JAVA_HOME", "/no/such/jdk")
    with pytest.raises(SparkUnavailable, match="JAVA_HOME"):
        build_session("local[1]")


def test_unreachable_or_unknown_master_fails_fast() -> None:
    with pytest.raises(MasterUnreachable, match="unreachable"):
        check_master("spark://127.0.0.1:9", timeout=2)
    with pytest.raises(MasterUnreachable, match="Unknown Spark master"):
        check_master("mongodb://x")
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("pgq_pipeline", "--master", "spark://127.0.0.1:9", "stats", stderr=err)
    assert "spark://127.0.0.1:9 is unreachable" in err.getvalue()


def test_python_m_entry_point_runs_a_job() -> None:
    """``python -m django_pgqueue.pipeline`` (what spark-submit runs) works without Spark
    for prune and reports a refusal with exit status 2."""
    from django.conf import settings
    from django.db import connection

    repo = Path(settings.REPO_DIR)
    s = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings"),
        "DATABASE_URL": f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}",
        "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "example_project"), *sys.path]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "django_pgqueue.pipeline", "prune", "--destination", "/x"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "no verified export range" in done.stderr
