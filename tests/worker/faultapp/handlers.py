"""Handlers whose outcomes PostgreSQL's ``jsonb`` cannot store as they are."""

from __future__ import annotations

from typing import Any

import django_pgqueue

#: Strings ``jsonb`` refuses, by name (a payload cannot carry them: it is ``jsonb`` too).
BAD_TEXT = {
    "nul": "before\x00after",
    "surrogate": "lone \ud800 surrogate",
    "low-surrogate": "\udc80 first",
}


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ fails too")


@django_pgqueue.handler("faults.return")
def return_bad(payload: dict[str, Any]) -> Any:
    """Returns ``BAD_TEXT[kind]`` as a value, nested in a list, or as a key."""
    text = BAD_TEXT[payload["kind"]]
    where = payload.get("where", "value")
    if where == "key":
        return {text: 1}
    if where == "nested":
        return {"ok": [1, {"deep": text}]}
    return text


@django_pgqueue.handler("faults.return-size")
def return_size(payload: dict[str, Any]) -> str:
    return "x" * payload["chars"]


@django_pgqueue.handler("faults.raise")
def raise_bad(payload: dict[str, Any]) -> None:
    """Raises with ``BAD_TEXT[kind]`` (or ``payload["chars"]`` x's) in its message."""
    kind = payload["kind"]
    if kind == "broken-str":
        raise BrokenStr()
    if kind == "size":
        raise ValueError("x" * payload["chars"])
    raise ValueError(BAD_TEXT[kind])
