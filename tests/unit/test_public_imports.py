"""The public modules import with Django configured and no database reachable.

The API reference and tools that read the package (mypy's plugin, a docs build that inspects
it) rely on this; so does any project that imports a handler module at start-up.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PUBLIC_MODULES = [
    "django_pgqueue",
    "django_pgqueue.conf",
    "django_pgqueue.exceptions",
    "django_pgqueue.models",
    "django_pgqueue.core.transitions",
    "django_pgqueue.core.operations",
]

SCRIPT = """
import importlib, importlib.util, sys
import django
django.setup()
modules = sys.argv[1:]
if importlib.util.find_spec("django.tasks") is not None:
    modules.append("django_pgqueue.tasks")
for name in modules:
    importlib.import_module(name)
from django.db import connections
assert connections["default"].connection is None, "a database connection was opened"
print("imported", len(modules))
"""


def test_public_modules_import_without_a_database():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.typecheck_settings",
        # Any connection attempt fails at once: nothing listens on port 1.
        "PGHOST": "127.0.0.1",
        "PGPORT": "1",
        "PYTHONPATH": str(REPO),
    }
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *PUBLIC_MODULES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("imported")
