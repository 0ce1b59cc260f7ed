"""A worker's HTTP endpoints (``--metrics-port``, ``--health-port``) in tests: reading them,
and running ``pgq_worker`` to see a flag refused."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

from tests.acceptance.conftest import REPO, WorkerProcess
from tests.dsn import database_url


def endpoint_port(worker: WorkerProcess, path: str) -> int:
    """The port the worker logged for ``path`` (started with port 0: any free port)."""
    line = worker.wait_for_line(rf"serves .*{re.escape(path)}.* on http://")
    return int(line.rsplit(":", 1)[1])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    status, body = get(port, path)
    return status, json.loads(body)


def run_pgq_worker(*args: str, path_first: str | None = None) -> subprocess.CompletedProcess[str]:
    """``pgq_worker --burst *args`` to its end (a flag's error); ``path_first`` goes before
    everything else on the import path (e.g. a module that hides an installed package)."""
    paths = [str(REPO), str(REPO / "example_project")]
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=database_url(),
        PYTHONPATH=os.pathsep.join([path_first, *paths] if path_first else paths),
    )
    return subprocess.run(
        [sys.executable, "-m", "django", "pgq_worker", "--burst", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
