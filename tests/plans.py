"""Reading query plans in tests: is every access to the live table a bounded index lookup?"""

from __future__ import annotations

import json
from collections.abc import Iterator
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
