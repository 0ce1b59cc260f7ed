"""The Spark session as a user gets it: secrets out of process lists, the driver's Python on
executors, a standalone master started here from the pyspark package."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from django_pgqueue.exceptions import PipelineError
from django_pgqueue.models import Message
from django_pgqueue.pipeline.session import read_conf_file
from tests.dsn import database_url

from .conftest import _spark_missing

pytestmark = [pytest.mark.spark]

REPO = Path(settings.REPO_DIR)


def test_conf_file_format_errors_name_the_line_not_the_value(tmp_path: Path) -> None:
    path = tmp_path / "spark.conf"
    path.write_text("# s3\nspark.hadoop.fs.s3a.secret.key = s3cr3t\nspark.a=b\n")
    assert read_conf_file(str(path)) == {"spark.hadoop.fs.s3a.secret.key": "s3cr3t", "spark.a": "b"}
    path.write_text("spark.hadoop.fs.s3a.secret.key\\\n    s3cr3t\n")
    with pytest.raises(PipelineError, match="line 1") as caught:
        read_conf_file(str(path))
    assert "s3cr3t" not in str(caught.value)


def _without_venv_on_path() -> str:
    """PATH without this virtualenv: "python3" there is another interpreter (or none)."""
    venv_bin = str(Path(sys.executable).parent)
    return os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    env.update(PATH=_without_venv_on_path(), SPARK_LOCAL_IP="127.0.0.1", TZ="UTC", **extra)
    return env


def _command_lines() -> list[str]:
    lines = []
    for entry in Path("/proc").iterdir():
        try:
            lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, ValueError):
            continue
    return lines


SESSION_PROBE = """
import json, sys
from pathlib import Path
from django_pgqueue.pipeline.session import build_session

spark = build_session("local[1]", conf_file=sys.argv[1], testing=True)
secret = sys.argv[2]
leaked = []
for entry in Path("/proc").iterdir():
    try:
        line = (entry / "cmdline").read_bytes().replace(b"\\0", b" ").decode()
    except (OSError, ValueError):
        continue
    if secret in line and "SESSION_PROBE" not in line:
        leaked.append(line[:200].replace(secret, "<secret>"))
hadoop = spark.sparkContext._jsc.hadoopConfiguration()
versions = spark.sparkContext.parallelize(range(2), 2).map(
    lambda _: __import__("sys").version_info[:2]
).collect()
print(json.dumps({
    "leaked": leaked,
    "arrived": hadoop.get("fs.s3a.secret.key") == secret,
    "python": spark.sparkContext.getConf().get("spark.pyspark.python"),
    "worker_versions": [list(v) for v in versions],
}))
spark.stop()
"""


@pytest.mark.slow
def test_a_secret_in_the_conf_file_never_shows_in_a_command_line(tmp_path: Path) -> None:
    """PySpark starts its JVM with every builder setting as ``--conf key=value``: readable by
    anyone with ``ps``. A value from --spark-conf-file reaches the JVM by the file's path."""
    missing = _spark_missing()
    if missing:
        pytest.skip(missing)
    secret = "pgq-" + secrets.token_hex(12)
    conf = tmp_path / "secret.conf"
    conf.write_text(f"spark.hadoop.fs.s3a.secret.key {secret}\n")
    conf.chmod(0o600)
    probe = tmp_path / "probe.py"
    probe.write_text(SESSION_PROBE)
    # The secret is an argument of the probe only (a test artefact); the probe's own command
    # line is excluded by the marker in its path, every other process line is checked.
    probe = probe.rename(tmp_path / "SESSION_PROBE.py")
    done = subprocess.run(
        [sys.executable, str(probe), str(conf), secret],
        cwd=REPO, env=_child_env(), capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["leaked"] == []
    assert seen["arrived"] is True
    # Python workers run the driver's interpreter, not "python3" from PATH.
    assert seen["python"] == sys.executable
    assert seen["worker_versions"] == [list(sys.version_info[:2])] * 2
    assert secret not in done.stdout + done.stderr


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def standalone_master(tmp_path: Path) -> Iterator[str]:
    """A Spark standalone master and one worker, from the pyspark package's spark-class."""
    missing = _spark_missing()
    if missing:
        pytest.skip(missing)
    from pyspark.find_spark_home import _find_spark_home

    spark_class = str(Path(_find_spark_home()) / "bin" / "spark-class")
    port, ui = _free_port(), _free_port()
    env = _child_env(SPARK_WORKER_DIR=str(tmp_path / "work"), SPARK_LOG_DIR=str(tmp_path))
    master = f"spark://127.0.0.1:{port}"
    daemons = []
    logs = []
    try:
        for name, args in [
            ("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                        "--port", str(port), "--webui-port", str(ui)]),
            ("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--webui-port", str(_free_port()), "--cores", "2", "--memory", "1g",
                        master]),
        ]:  # fmt: skip
            log = (tmp_path / f"{name}.log").open("w")
            logs.append(log)
            daemons.append(
                subprocess.Popen(
                    [spark_class, *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as page:
                    if json.load(page).get("aliveworkers", 0) >= 1:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("standalone master/worker did not start: " + _tail(tmp_path))
            time.sleep(0.5)
        yield master
    finally:
        for daemon in reversed(daemons):
            os.killpg(daemon.pid, 15)  # the JVM and the executors it started
        for daemon in daemons:
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, 9)
                daemon.wait()
        for log in logs:
            log.close()


def _tail(directory: Path) -> str:
    return " | ".join(p.read_text()[-1500:] for p in sorted(directory.glob("*.log")))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_enqueue_on_a_standalone_master_without_exporting_anything(
    standalone_master: str, tmp_path: Path
) -> None:
    """The documented cluster run: no PYSPARK_PYTHON exported, "python3" on PATH is not the
    driver's interpreter; the executors still run the driver's one."""
    path = tmp_path / "users.csv"
    path.write_text("user_id,email\n" + "".join(f"{n},u{n}@example.com\n" for n in range(50)))
    command = [
        sys.executable, "-m", "django_pgqueue.pipeline", "--master", standalone_master,
        "--json", "enqueue", str(path), "--task", "emails.welcome", "--queue", "cluster",
        "--dedup-key-column", "user_id",
    ]  # fmt: skip
    env = _child_env(
        DJANGO_SETTINGS_MODULE=os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings"),
        DATABASE_URL=database_url(),
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "example_project")]),
    )
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )

    assert done.returncode == 0, done.stderr[-3000:] + _tail(tmp_path)
    assert json.loads(done.stdout)["enqueued"] == 50
    assert "partitions" in done.stderr  # progress while it ran
    message = Message.objects.get(queue="cluster", dedup_key="7")
    assert message.payload == {"user_id": "7", "email": "u7@example.com"}
