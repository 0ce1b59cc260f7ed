"""The zero-setup path: no DATABASE_URL -> a real embedded PostgreSQL; set -> that server."""

import importlib.util
import os
import signal
import subprocess
import sys

import psycopg
import pytest

from django_pgqueue.embedded import database_from_environment, embedded_database, stop_embedded

# The embedded server is the [embedded] extra; pgserver has no wheel for Python 3.13.
needs_pgserver = pytest.mark.skipif(
    importlib.util.find_spec("pgserver") is None, reason="pgserver is not installed"
)


@pytest.mark.slow
@needs_pgserver
def test_embedded_server_starts_and_answers(tmp_path):
    pgdata = tmp_path / "pgdata"
    config = embedded_database(pgdata)
    try:
        assert config["ENGINE"] == "django.db.backends.postgresql"
        with psycopg.connect(
            dbname=config["NAME"], user=config["USER"], host=config["HOST"], autocommit=True
        ) as conn:
            assert conn.execute("SELECT 1 + 1").fetchone() == (2,)
            assert conn.info.server_version >= 130000
        # A second call reuses the running server in the same folder.
        assert embedded_database(pgdata)["HOST"] == config["HOST"]
    finally:
        # The server outlives its process by design (fast restarts): stop this test's one.
        postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGTERM)


@pytest.mark.slow
@needs_pgserver
def test_the_embedded_server_runs_on_after_its_process_until_stopped(tmp_path):
    pgdata = tmp_path / "pgdata"
    embedded = [sys.executable, "-m", "django_pgqueue.embedded"]
    started = subprocess.run([*embedded, "url", str(pgdata)], capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    try:
        os.kill(postmaster, 0)  # the process that started it has exited; the server runs on
        with psycopg.connect(started.stdout.strip(), autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        stopped = subprocess.run([*embedded, "stop", str(pgdata)], capture_output=True, text=True)
        assert stopped.returncode == 0, stopped.stderr
        assert "stopped" in stopped.stdout
        with pytest.raises(ProcessLookupError):
            os.kill(postmaster, 0)
        assert stop_embedded(pgdata) is False
    finally:
        try:
            os.kill(postmaster, signal.SIGTERM)
        except ProcessLookupError:
            pass


def test_database_url_wins_over_the_embedded_server(monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", "postgres://alice:secret@db.example:6543/shop")
    config = database_from_environment(tmp_path / "never-created")
    assert config["NAME"] == "shop"
    assert config["HOST"] == "db.example"
    assert int(config["PORT"]) == 6543
    assert not (tmp_path / "never-created").exists()
