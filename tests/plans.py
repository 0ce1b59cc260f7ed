"""Reading query plans in tests: is every access to the live table a bounded index lookup?"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
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
    cursor: Any,
    statement: str,
    params: Sequence[Any] | Mapping[str, Any],
    local_settings: Mapping[str, str],
    *,
    analyze: bool = False,
) -> dict[str, Any]:
    """``EXPLAIN (FORMAT JSON) EXECUTE`` (``analyze``: ``EXPLAIN (ANALYZE, ...)``, which runs
    it) of each prepared statement of this session whose
    text is ``statement`` as sent (``_send.as_sent``) and prepared by psycopg (its
    placeholders numbered), with
    ``params``, under ``local_settings`` (those the statement runs under: its cached generic
    plan is what gets explained). Plans by statement name."""
    from django.db import transaction

    from django_pgqueue.core._execution import set_local
    from django_pgqueue.core._send import as_sent

    statement = as_sent(statement)  # the text the session prepared
    if isinstance(params, Mapping):
        params = [params[name] for name in dict.fromkeys(re.findall(r"%\((\w+)\)s", statement))]
    pattern = re.compile(
        re.sub(
            r"%%|%\\\(\w+\\\)s|%s",
            lambda m: "%" if m.group() == "%%" else r"\$\d+",
            re.escape(statement),
        )
    )
    cursor.execute("SELECT name, statement FROM pg_prepared_statements")
    names = [name for name, text in cursor.fetchall() if pattern.fullmatch(text)]
    values = cursor.cursor.mogrify(", ".join(["%s"] * len(params)), list(params))
    plans = {}
    for name in names:
        with transaction.atomic():
            if local_settings:
                cursor.execute(set_local(local_settings))
            options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
            cursor.execute(f"EXPLAIN ({options}) EXECUTE {name}({values})")
            plans[name] = cursor.fetchone()[0]
    return plans


@contextmanager
def nested_plans(connection: Any) -> Iterator[list[dict[str, Any]]]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of every statement run meanwhile on Django's
    ``connection``, those inside SQL functions included (the flow-control claim's), as
    ``auto_explain`` sends them to the client at NOTICE level: a list of ``{"Query Text",
    "Plan"}`` entries, in the order they finished."""
    raw = connection.connection
    found: list[dict[str, Any]] = []

    def on_notice(diagnostic: Any) -> None:
        text = diagnostic.message_primary or ""
        if text.startswith("duration:") and "plan:" in text:
            found.append(json.loads(text.split("plan:", 1)[1]))

    import pytest
    from django.db import DatabaseError, transaction

    try:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute("LOAD 'auto_explain'")
    except DatabaseError:  # a server built without contrib (the embedded one)
        pytest.skip("this PostgreSQL has no auto_explain module")
    with connection.cursor() as cursor:
        for setting, value in _AUTO_EXPLAIN.items():
            cursor.execute(f"SET auto_explain.{setting} = {value}")
    raw.add_notice_handler(on_notice)
    try:
        yield found
    finally:
        raw.remove_notice_handler(on_notice)
        with connection.cursor() as cursor:
            cursor.execute("SET auto_explain.log_min_duration = -1")


_AUTO_EXPLAIN = {
    "log_min_duration": "0",
    "log_nested_statements": "on",
    "log_analyze": "on",
    "log_buffers": "on",
    "log_timing": "off",
    "log_format": "json",
    "log_level": "notice",
}


def buffers(plan: Mapping[str, Any]) -> int:
    """Shared buffers a plan's root node hit or read (its whole statement's)."""
    root = plan["Plan"]
    return int(root.get("Shared Hit Blocks", 0)) + int(root.get("Shared Read Blocks", 0))
