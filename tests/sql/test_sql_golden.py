"""Every statement the package can send, rendered to ``tests/sql/golden/``: a change to one
shows in review as a diff of its file (``.sql.txt``: data, not source the linters read).

After changing SQL on purpose, regenerate and commit the files:

    PGQUEUE_REGENERATE_SQL=1 pytest tests/sql

The test fails when a statement differs from its file, and when a file names a statement
that no longer exists.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from django_pgqueue import counts
from django_pgqueue.admin import sql as admin_sql
from django_pgqueue.composition import progress as composition_progress
from django_pgqueue.composition import retry as composition_retry
from django_pgqueue.core import (
    _claim_sql,
    _composition_sql,
    _flow_sql,
    _job_control_sql,
    _periodic_sql,
    _retention_sql,
)
from django_pgqueue.core import _sql as core_sql
from django_pgqueue.metrics import queues as metrics_queues
from django_pgqueue.tasks import sql as tasks_sql
from django_pgqueue.worker import sql as worker_sql

GOLDEN = Path(__file__).parent / "golden"
REGENERATE = os.environ.get("PGQUEUE_REGENERATE_SQL") == "1"

#: The modules holding named SQL, by the folder their statements render to.
NAMED = {
    "claim": _claim_sql,
    "composition": _composition_sql,
    "composition_progress": composition_progress,
    "composition_retry": composition_retry,
    "core": core_sql,
    "periodic": _periodic_sql,
    "retention": _retention_sql,
    "job_control": _job_control_sql,
    "worker": worker_sql,
    "admin": admin_sql,
    "tasks": tasks_sql,
    "counts": counts,
    "metrics": metrics_queues,
}


def named_statements(module: ModuleType) -> Iterator[tuple[str, str]]:
    """The module's public SQL constants (CTE fragments included: they are reviewed too)."""
    for name, value in vars(module).items():
        if name.isupper() and not name.startswith("_") and isinstance(value, str) and value.strip():
            yield name, value


def rendered() -> dict[str, str]:
    statements = {}
    for folder, module in NAMED.items():
        for name, text in named_statements(module):
            statements[f"{folder}/{name}.sql.txt"] = text
    for name, text in _flow_sql.DEFINITIONS.items():
        statements[f"flow_control/{name}.sql.txt"] = text
    return {path: text.strip() + "\n" for path, text in statements.items()}


@pytest.mark.django_db
def test_every_statement_matches_its_golden_file():
    statements = rendered()
    on_disk = {str(p.relative_to(GOLDEN)): p for p in GOLDEN.rglob("*.sql.txt")}
    if REGENERATE:
        for path in set(on_disk) - set(statements):
            on_disk[path].unlink()
        for path, text in statements.items():
            target = GOLDEN / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        return
    hint = "SQL changed: regenerate with PGQUEUE_REGENERATE_SQL=1 pytest tests/sql, review the diff"
    assert sorted(set(on_disk) - set(statements)) == [], f"golden files of no statement; {hint}"
    assert sorted(set(statements) - set(on_disk)) == [], f"statements without a file; {hint}"
    changed = [path for path, text in statements.items() if on_disk[path].read_text() != text]
    assert changed == [], hint
