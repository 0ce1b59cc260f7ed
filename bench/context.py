"""What every scenario gets: where the database is, the sizes, the probe, the recorder."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from .config import Sizes
from .measure import Recorder, UdpCollector
from .pg import StatsProbe, dsn_for, recreate_database

REPO_DIR = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_DIR / "bench"
VENVS_DIR = BENCH_DIR / ".venvs"


def draw_plots(script: str, out_dir: Path) -> None:
    """Run a plotting script of bench/ on a results folder, in the plots virtualenv."""
    plot_python = VENVS_DIR / "plots" / "bin" / "python"
    if plot_python.exists():
        subprocess.run([str(plot_python), str(BENCH_DIR / script), str(out_dir)], check=False)
    else:
        print("!! no plots venv (bash bench/run.sh creates it); plots skipped", file=sys.stderr)


def stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def results_dir(out: str, suffix: str) -> Path:
    """``out``, or a new folder under bench/results named after now and ``suffix``."""
    folder = Path(out) if out else BENCH_DIR / "results" / f"{stamp()}-{suffix}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def peers_with_venvs(names: str) -> list[str]:
    """The comma-separated peers that have their virtualenv; the others are said and skipped."""
    peers = [p for p in names.split(",") if p]
    missing = [p for p in peers if not (VENVS_DIR / p / "bin" / "python").exists()]
    if missing:
        print(f"!! no virtualenv for {missing} (bash bench/run.sh --setup-only)", file=sys.stderr)
    return [p for p in peers if p not in missing]


@dataclass
class Context:
    server_dsn: str
    dbname: str
    dsn: str
    sizes: Sizes
    probe: StatsProbe
    recorder: Recorder
    udp: UdpCollector
    out_dir: Path
    peers: list[str] = field(default_factory=list)
    python: str = sys.executable

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a helper process running this checkout's code."""
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_DIR) + os.pathsep + env.get("PYTHONPATH", "")
        env["BENCH_DSN"] = self.dsn
        env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
        env["BENCH_UDP_PORT"] = str(self.udp.port)
        env.update(extra)
        return env

    def spawn(
        self, args: list[str], log_name: str, *, pipe_stdout: bool = True, **env: str
    ) -> subprocess.Popen[str]:
        """Start a helper; stderr (and stdout unless piped) go to ``<out>/logs/<log_name>.log``
        so that a chatty process can never block on a full pipe."""
        logs = self.out_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = open(logs / f"{log_name}.log", "a")
        return subprocess.Popen(
            args,
            cwd=REPO_DIR,
            env=self.env(**env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE if pipe_stdout else log,
            stderr=log,
            text=True,
        )


@contextmanager
def harness(
    server_dsn: str, dbname: str, sizes: Sizes, out_dir: Path, peers: list[str], recorder: Recorder
) -> Iterator[Context]:
    """A new, migrated ``dbname`` with Django set up on it, the statistics probe and the UDP
    collector, for the block; closed at its end (the database is left to the caller)."""
    from . import core_cases

    recreate_database(server_dsn, dbname)
    dsn = dsn_for(server_dsn, dbname)
    core_cases.setup_django(dsn)
    probe = StatsProbe(server_dsn, dbname)
    udp = UdpCollector()
    try:
        yield Context(server_dsn, dbname, dsn, sizes, probe, recorder, udp, out_dir, peers)
    finally:
        udp.close()
        probe.close()
        core_cases.close_connections()
