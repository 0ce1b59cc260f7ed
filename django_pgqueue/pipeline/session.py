"""Starting Spark for the pipeline: pyspark and Java checks, the JDBC driver, the master URL.

pyspark is imported here, lazily, so ``django_pgqueue`` works without the ``spark`` extra.
Database connection settings always come from Django's ``DATABASES``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from django.db import connections

from ..conf import get_settings
from ..exceptions import MasterUnreachable, PipelineError, SparkUnavailable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Debian/Ubuntu's ``libpostgresql-jdbc-java`` installs the driver here.
DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
JDBC_JAR_ENV = "PGQUEUE_PIPELINE_JDBC_JAR"
JDBC_PACKAGES_ENV = "PGQUEUE_PIPELINE_JDBC_PACKAGES"
DEFAULT_MASTER = "local[*]"
JDBC_DRIVER_CLASS = "org.postgresql.Driver"
#: Rows per JDBC round trip: without it pgjdbc buffers a whole partition in the heap.
JDBC_FETCHSIZE = 10_000
PYTHON_CONF = "spark.pyspark.python"
#: Keys whose values are secrets, as Spark's own ``spark.redaction.regex`` default sees them.
SECRET_KEY = re.compile(r"(?i)secret|password|token|access[.]?key|credential")


def import_pyspark() -> Any:
    try:
        import pyspark
    except ImportError as exc:
        raise SparkUnavailable(
            "The pipeline needs pyspark: pip install 'django-pgqueue-mq[spark]' "
            "(pyspark>=4.0 and pyarrow, plus a Java 17+ runtime)."
        ) from exc
    return pyspark


def find_java() -> str:
    """The java executable Spark will launch, or :class:`SparkUnavailable` saying what to do."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.exists():
            return str(candidate)
        raise SparkUnavailable(
            f"JAVA_HOME is {java_home!r} but {candidate} does not exist. Point JAVA_HOME at a "
            "Java 17+ installation, or unset it to use the java on PATH."
        )
    found = shutil.which("java")
    if found is None:
        raise SparkUnavailable(
            "No Java runtime found: Spark 4 needs Java 17 or newer. Install one, e.g. "
            "`apt-get install openjdk-17-jre-headless` (Debian/Ubuntu), "
            "`brew install openjdk@17` (macOS), or set JAVA_HOME."
        )
    return found


def jdbc_jar() -> str | None:
    """Path of the PostgreSQL JDBC jar, or None when Maven coordinates are given instead."""
    if os.environ.get(JDBC_PACKAGES_ENV):
        return None
    jar = os.environ.get(JDBC_JAR_ENV, DEFAULT_JDBC_JAR)
    if not Path(jar).is_file():
        raise SparkUnavailable(
            f"PostgreSQL JDBC driver not found at {jar}. Install it with "
            "`apt-get install libpostgresql-jdbc-java` (Debian/Ubuntu), point "
            f"{JDBC_JAR_ENV} at a postgresql-42.x.jar, or set {JDBC_PACKAGES_ENV}="
            "org.postgresql:postgresql:42.7.4 to let Spark fetch it from Maven."
        )
    return jar


def check_master(master: str, timeout: float = 5.0) -> None:
    """Fail fast on a ``spark://`` / ``sc://`` master that does not answer.

    Spark itself retries an unreachable standalone master for about a minute before it gives
    up with "All masters are unresponsive"; a TCP probe says the same thing in seconds.
    ``local[...]``, ``yarn`` and ``k8s://`` are left to Spark.
    """
    if not master:
        raise MasterUnreachable("Empty Spark master URL; use local[*], spark://host:7077, ...")
    scheme = master.split("://", 1)[0] if "://" in master else master.split("[", 1)[0]
    if scheme not in {"spark", "sc"}:
        if scheme not in {"local", "local-cluster", "yarn", "k8s", "mesos"}:
            raise MasterUnreachable(
                f"Unknown Spark master {master!r}: use local[*], local[N], spark://host:port, "
                "sc://host:port, yarn or k8s://https://host:port."
            )
        return
    default_port = 7077 if scheme == "spark" else 15002
    for hostport in master.split("://", 1)[1].split("/", 1)[0].split(","):
        parsed = urlsplit(f"//{hostport}")
        host, port = parsed.hostname, parsed.port or default_port
        if not host:
            raise MasterUnreachable(f"Spark master {master!r} names no host.")
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as exc:
            last_error = exc
    raise MasterUnreachable(
        f"Spark master {master} is unreachable ({last_error}). Check the URL and that the "
        "master is running, or use --master local[*] to run embedded."
    )


@dataclass(frozen=True)
class JdbcTarget:
    """Where Spark's JDBC source and sink connect: the Django database the queue uses."""

    url: str
    properties: dict[str, str]

    def options(self, **extra: Any) -> dict[str, str]:
        merged = {"url": self.url, **self.properties}
        merged.update({key: str(value) for key, value in extra.items()})
        return merged


def jdbc_target(using: str | None = None) -> JdbcTarget:
    """The JDBC URL and properties for ``DATABASES[using]`` (default: the queue's alias)."""
    alias = using or get_settings().DATABASE_ALIAS
    settings = connections[alias].settings_dict
    host = settings.get("HOST") or "localhost"
    if host.startswith("/"):
        raise PipelineError(
            f"DATABASES[{alias!r}]['HOST'] is a Unix socket directory ({host}); Spark's JDBC "
            "driver needs TCP. Set HOST to a host name or 127.0.0.1."
        )
    port = settings.get("PORT") or 5432
    name = settings.get("NAME") or ""
    # stringtype=unspecified lets text parameters land in jsonb columns; batched inserts are
    # rewritten into multi-row INSERTs (one round trip for many rows).
    url = (
        f"jdbc:postgresql://{host}:{port}/{quote(name)}"
        "?stringtype=unspecified&reWriteBatchedInserts=true&ApplicationName=pgq_pipeline"
    )
    properties = {"driver": JDBC_DRIVER_CLASS, "user": settings.get("USER") or ""}
    if settings.get("PASSWORD"):
        properties["password"] = settings["PASSWORD"]
    options = settings.get("OPTIONS") or {}
    if options.get("sslmode"):
        properties["sslmode"] = str(options["sslmode"])
    return JdbcTarget(url=url, properties=properties)


#: libpq parameters passed on from ``DATABASES[...]["OPTIONS"]`` to psycopg in Spark workers.
_LIBPQ_OPTIONS = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "connect_timeout",
    "options",
    "target_session_attrs",
)


def psycopg_dsn(using: str | None = None) -> str:
    """A libpq connection string for ``DATABASES[using]``, for psycopg inside Spark workers."""
    from psycopg.conninfo import make_conninfo

    alias = using or get_settings().DATABASE_ALIAS
    settings = connections[alias].settings_dict
    params: dict[str, Any] = {
        "dbname": settings.get("NAME") or "",
        "user": settings.get("USER") or "",
        "host": settings.get("HOST") or "",
        "port": settings.get("PORT") or "",
        "password": settings.get("PASSWORD") or "",
        "application_name": "pgq_pipeline",
    }
    options = settings.get("OPTIONS") or {}
    params.update({key: options[key] for key in _LIBPQ_OPTIONS if options.get(key)})
    return make_conninfo(**{key: str(value) for key, value in params.items() if value != ""})


def read_conf_file(path: str) -> dict[str, str]:
    """Spark properties from a ``spark-defaults.conf``-style file: one ``key value`` or
    ``key=value`` per line, ``#`` comments. Errors name the line, never echo a value."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PipelineError(f"Cannot read the Spark configuration file {path}: {exc}") from exc
    properties: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        match = re.match(r"([^\s=:]+)\s*[=:\s]\s*(.*)$", line)
        if match is None or "\\" in line:
            raise PipelineError(
                f"{path}, line {number}: expected `key value` or `key=value` "
                "(line continuations and escapes are not supported)."
            )
        properties[match.group(1)] = match.group(2)
    return properties


def build_session(
    master: str | None = None,
    *,
    app_name: str = "pgq_pipeline",
    conf: dict[str, str] | None = None,
    conf_file: str | None = None,
    testing: bool = False,
) -> SparkSession:
    """A SparkSession set up for the pipeline (UTC, JDBC driver shipped to executors).

    ``master`` None means: the one ``spark-submit --master`` chose when launched by it, the
    ``spark.master`` of ``conf_file``, otherwise ``local[*]`` (embedded, no cluster needed).

    ``conf`` entries reach the JVM as ``--conf key=value`` process arguments (PySpark starts
    it that way), where anyone on the host can read them; ``conf_file`` (properties, e.g.
    secrets) is handed to the JVM by its path, so its values never appear in a command line.
    Either overrides the pipeline's own defaults.

    Python workers run the driver's interpreter (``sys.executable``) unless
    ``PYSPARK_PYTHON`` or ``spark.pyspark.python`` says otherwise: on a cluster, executors
    then need the same path (a shared image or virtualenv), and no version mismatch occurs.
    """
    import_pyspark()
    find_java()
    conf = dict(conf or {})
    from_file = read_conf_file(conf_file) if conf_file else {}
    given = conf.keys() | from_file.keys()
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this process
    if master is None and not submitted and "spark.master" not in given:
        master = DEFAULT_MASTER
    if master is not None:
        check_master(master)
    jar = jdbc_jar()
    from pyspark.sql import SparkSession

    if master is not None and master.startswith("local"):
        # Otherwise Spark warns at every start that the host name resolves to loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must match the driver's minor version, and "python3" on an executor's
    # PATH may be another one (PYTHON_VERSION_MISMATCH), or lack pyarrow and psycopg. PySpark
    # sends executors the interpreter named by PYSPARK_PYTHON when the context starts.
    python = conf.get(PYTHON_CONF) or from_file.get(PYTHON_CONF)
    python = python or os.environ.get("PYSPARK_PYTHON") or sys.executable
    os.environ["PYSPARK_PYTHON"] = python
    defaults = {
        # Days and hours are UTC whatever the JVM's or the host's zone is.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.ui.showConsoleProgress": "false",
        PYTHON_CONF: python,
    }
    if jar is not None:
        defaults["spark.jars"] = jar
    else:
        defaults["spark.jars.packages"] = os.environ[JDBC_PACKAGES_ENV]
    if testing:
        defaults.update(
            {
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "2",
                "spark.default.parallelism": "2",
                "spark.driver.memory": "1g",
                "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
            }
        )
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in defaults.items():
        if key not in given:
            builder = builder.config(key, value)
    for key, value in conf.items():
        builder = builder.config(key, value)
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS")
    if from_file and submitted:
        # The JVM runs already: the values go to it over the gateway, not a command line.
        for key, value in from_file.items():
            builder = builder.config(key, value)
    elif from_file:
        # spark-submit reads the file itself and sets its values inside the JVM.
        assert conf_file is not None
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f"--properties-file {shlex.quote(str(Path(conf_file).resolve()))} "
            + (submit_args or "pyspark-shell")
        )
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        if "JAVA_GATEWAY_EXITED" in str(exc) or "Java gateway" in str(exc):
            raise SparkUnavailable(
                f"Spark's JVM did not start ({exc}). Check that `java -version` reports 17 or "
                "newer; install one with `apt-get install openjdk-17-jre-headless`."
            ) from exc
        raise
    finally:
        if submit_args is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args
    spark.sparkContext.setLogLevel("WARN")
    return spark


def default_parallelism(spark: SparkSession) -> int:
    return max(int(spark.sparkContext.defaultParallelism), 1)


def hadoop_fs(spark: SparkSession, url: str) -> tuple[Any, Any]:
    """``(FileSystem, Path)`` for a local path or any Hadoop-compatible URL (s3a://, hdfs://)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(url)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return fs, path
