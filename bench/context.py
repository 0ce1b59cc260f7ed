"""What every scenario gets: where the database is, the sizes, the probe, the recorder."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .config import Sizes
from .measure import Recorder, UdpCollector
from .pg import StatsProbe

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
