"""Reading query plans in tests: is every access to the live table a bounded index lookup?"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

LIVE_TABLE = "pgqueue_message"


def nodes(plan: Any) -> Iterator[dict[str, Any]]:
    """Every node of an ``EXPLAIN (FORMAT JSON)`` plan (its JSON text or its parsed form)."""
    if isinstance(plan, str):
        plan = json.loads(plan)
    stack = [entry["Plan"] for entry in plan]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.get("Plans", []))


def unbounded_reads(plan: Any, table: str = LIVE_TABLE) -> list[str]:
    """The nodes that read ``table`` without an index condition: a sequential scan, a bitmap
    scan, or a whole-index walk (an index scan without ``Index Cond``, which a hash join
    planned for a small table reads in full). Each costs O(table), not O(batch)."""
    return [
        f"{node['Node Type']} using {node.get('Index Name', '-')}"
        for node in nodes(plan)
        if node.get("Relation Name") == table
        and "Index Cond" not in node
        # An UPDATE / DELETE node names the table it writes, not a read of it.
        and node["Node Type"] != "ModifyTable"
    ]


def explain_prepared(
    cursor: Any, name_pattern: str, params: Sequence[Any], local_settings: Mapping[str, str]
) -> dict[str, Any]:
    """``EXPLAIN (FORMAT JSON) EXECUTE`` of each session-prepared statement whose name
    matches the regular expression ``name_pattern``, with ``params``, under
    ``local_settings`` (those the statement runs under: its cached generic plan is what gets
    explained). Plans by statement name."""
    from django.db import transaction

    from django_pgqueue.core.execution import set_local

    cursor.execute("SELECT name FROM pg_prepared_statements")
    names = [row[0] for row in cursor.fetchall() if re.fullmatch(name_pattern, row[0])]
    values = cursor.cursor.mogrify(", ".join(["%s"] * len(params)), list(params))
    plans = {}
    for name in names:
        with transaction.atomic():
            if local_settings:
                cursor.execute(set_local(local_settings))
            cursor.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({values})")
            plans[name] = cursor.fetchone()[0]
    return plans
