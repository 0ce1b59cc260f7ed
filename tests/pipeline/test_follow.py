"""``pgq_pipeline export --every``: passes in one process and one Spark session, retried
passes, and the stop on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import OperationalError
from django.db.models import Sum

from django_pgqueue.exceptions import DestinationBusy, ForeignOutput
from django_pgqueue.pipeline.follow import follow
from django_pgqueue.pipeline.models import ExportRange, ExportRangeStatus
from tests.dsn import database_url

from .conftest import _spark_missing, fill_archive

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(settings.REPO_DIR)
# PySpark prints this once per JVM it starts.
JVM_STARTED = "Using Spark's default log4j profile"


def _verified_rows(destination: str) -> int:
    ranges = ExportRange.objects.filter(destination=destination, status=ExportRangeStatus.VERIFIED)
    return int(ranges.aggregate(rows=Sum("source_rows"))["rows"] or 0)


def _wait_for(
    condition: Callable[[], bool], what: str, proc: subprocess.Popen[str], log: Path
) -> None:
    deadline = time.monotonic() + 180
    while not condition():
        if proc.poll() is not None:
            tail = log.read_text()[-2000:]
            pytest.fail(f"the export ended (status {proc.returncode}) before {what}: {tail}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within 180 s")
        time.sleep(0.5)


@pytest.mark.spark
@pytest.mark.slow
def test_every_exports_what_comes_in_one_spark_session_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    missing = _spark_missing()
    if missing:
        pytest.skip(missing)
    destination = str(tmp_path / "out")
    fill_archive(300)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))},
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url(),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "example_project"), *sys.path]),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "TZ": "UTC",
        "PYTHONUNBUFFERED": "1",  # each pass's line readable at once
    }
    command = [sys.executable, "-m", "django_pgqueue.pipeline", "--master", "local[1]",
               "export", destination, "--range-size", "100", "--every", "0.5"]  # fmt: skip
    with (tmp_path / "out.log").open("w+") as out, (tmp_path / "err.log").open("w+") as err:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=err, text=True)
        try:
            _wait_for(
                lambda: _verified_rows(destination) == 300, "first pass", proc, Path(err.name)
            )
            # An idle pass comes next: decided from PostgreSQL, no Spark job.
            _wait_for(
                lambda: "nothing new to export" in Path(out.name).read_text(),
                "idle pass",
                proc,
                Path(err.name),
            )
            fill_archive(200)
            _wait_for(
                lambda: _verified_rows(destination) == 500, "later pass", proc, Path(err.name)
            )
            proc.send_signal(signal.SIGTERM)
            status = proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        printed, progress = out.read(), err.read()

    assert status == 0, progress[-3000:]
    passes = [line for line in printed.splitlines() if line.startswith("export #")]
    assert len(passes) >= 2, printed
    assert progress.count(JVM_STARTED) == 1, progress[-3000:]
    assert "SIGTERM: stopping after the running pass" in progress


def test_a_busy_destination_or_a_database_error_is_retried_at_the_next_pass() -> None:
    stop = threading.Event()
    reports: list[str] = []
    outcomes: list[Exception | None] = [
        DestinationBusy("destination /x is being written by run #7"),
        OperationalError("server closed the connection\nunexpectedly"),
        None,
    ]

    def export_pass() -> int:
        outcome = outcomes.pop(0)
        if not outcomes:
            stop.set()
        if outcome is not None:
            raise outcome
        return 0

    status = follow(export_pass, 0.01, alias="default", report=reports.append, stop=stop)

    assert status == 0 and outcomes == []
    assert reports == [
        "export: pass failed (destination /x is being written by run #7); next pass in 0.01 s",
        "export: pass failed (server closed the connection unexpectedly); next pass in 0.01 s",
    ]


def test_an_error_a_later_pass_cannot_get_past_ends_the_command() -> None:
    calls = []

    def export_pass() -> int:
        calls.append(1)
        raise ForeignOutput("/x holds files not written by pgq_pipeline")

    with pytest.raises(ForeignOutput):
        follow(export_pass, 0.01, alias="default", report=print, stop=threading.Event())
    assert len(calls) == 1


@pytest.mark.parametrize("every", ["0", "-5", "soon", "inf"])
def test_every_takes_a_positive_number_of_seconds(every: str) -> None:
    with pytest.raises(CommandError, match="a number of seconds > 0"):
        call_command("pgq_pipeline", "export", "/tmp/x", "--every", every)
