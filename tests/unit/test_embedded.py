"""The zero-setup path: no DATABASE_URL -> a real embedded PostgreSQL; set -> that server."""

import importlib.util
import os
import signal
import subprocess
import sys

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured

from django_pgqueue import embedded
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


# -- where pgserver has no wheel (Python 3.13): the machine's PostgreSQL ---------------------

needs_binaries = pytest.mark.skipif(
    embedded.machine_binaries() is None, reason="no PostgreSQL binaries on this machine"
)
#: ``python -m django_pgqueue.embedded`` as on Python 3.13: pgserver cannot be imported.
WITHOUT_PGSERVER = (
    "import sys; sys.modules['pgserver'] = None; "
    "from django_pgqueue.embedded import main; sys.exit(main(sys.argv[1:]))"
)


def test_a_server_this_machine_runs_is_found(settings):
    """The suite's own server, when it is the machine's usual one (127.0.0.1:5432, trust)."""
    db = settings.DATABASES["default"]
    if (db["HOST"], str(db["PORT"]), db["USER"]) != ("127.0.0.1", "5432", "postgres"):
        pytest.skip("the tests do not run on a server at 127.0.0.1:5432 as postgres")
    assert embedded.local_server_url() == "postgres://postgres@127.0.0.1:5432/postgres"
    found = subprocess.run(
        [sys.executable, "-m", "django_pgqueue.embedded", "local"], capture_output=True, text=True
    )
    assert (found.returncode, found.stdout.strip()) == (0, embedded.local_server_url())


@pytest.mark.slow
@needs_binaries
def test_without_pgserver_the_machines_binaries_serve_or_it_says_what_to_do(tmp_path):
    pgdata = tmp_path / "pgdata"
    started = subprocess.run(
        [sys.executable, "-c", WITHOUT_PGSERVER, "url", str(pgdata)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if os.geteuid() == 0:
        # PostgreSQL refuses root: one message with the exact ways out, no traceback.
        assert started.returncode == 1 and "Traceback" not in started.stderr
        assert "refuse to run as root" in started.stderr
        assert "export DATABASE_URL=postgres://" in started.stderr
        assert "run as a user other than root" in started.stderr
        assert not (pgdata / "PG_VERSION").exists()
        return
    assert started.returncode == 0, started.stderr
    try:
        with psycopg.connect(started.stdout.strip(), autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        # A second process reuses the running server.
        again = subprocess.run(
            [sys.executable, "-c", WITHOUT_PGSERVER, "url", str(pgdata)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.stdout == started.stdout
    finally:
        assert stop_embedded(pgdata)


def test_without_pgserver_nor_binaries_the_message_says_exactly_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setattr(embedded, "machine_binaries", lambda: None)
    with pytest.raises(ImproperlyConfigured) as raised:
        embedded.machine_database(tmp_path / "pgdata")
    text = str(raised.value)
    assert "no PostgreSQL binaries (initdb, pg_ctl) were found" in text
    assert "export DATABASE_URL=postgres://" in text
    assert "sudo apt-get install postgresql" in text
    assert 'sudo -u postgres createuser --superuser "$USER"' in text
    if sys.version_info < (3, 13):
        assert "pip install 'django-pgqueue-mq[embedded]'" in text
    else:
        assert "no wheel for Python 3.13" in text and "[embedded]" not in text
