"""Running a bench entry point the way a user does: a subprocess of this checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[2]


def run_bench(module: str, *args: str, env: dict[str, str] | None = None) -> str:
    """``python -m <module> <args>`` from the repository root; fails the test (with the end of
    its output) unless it exits 0. Returns what it printed."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def table_rows(printed: str) -> list[list[str]]:
    """The cells of every markdown table row printed (header first, separators left out)."""
    return [line.split("|")[1:-1] for line in printed.splitlines() if line.startswith("| ")]
