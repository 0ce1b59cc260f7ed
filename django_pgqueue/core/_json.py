"""JSON text in and out of the message tables: orjson when the ``fast`` extra is installed,
the standard library otherwise, with the same answer either way.

orjson writes some values the standard library refuses (NaN and infinities as ``null``, a
UUID, an Enum member) and refuses some it writes (integers past 64 bits, keys that are not
strings, text with a lone surrogate). So it encodes only values whose every part it writes as
the standard library does: dicts with ``str`` keys, lists, tuples, ``str``, ``int``, ``bool``,
``None`` and finite floats; anything else, and anything orjson refuses, goes to the standard
library, whose JSON or error is then the answer. A float may be spelled differently
(``1e-07`` or ``1e-7``): the same number, which ``jsonb`` stores alike. Decoding leaves to
the standard library text with a run of 19 digits or more (orjson reads an integer past 64
bits as a float) and what orjson refuses (deep nesting): the same values either way.
"""

from __future__ import annotations

import json
import re
from typing import Any

try:
    import orjson
except ImportError:  # the ``fast`` extra is not installed
    orjson = None  # type: ignore[assignment]

__all__ = ["dumps", "loads"]

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# Deeper than this, orjson refuses anyway (it stops at 254 levels).
_MAX_DEPTH = 200
_SCALARS = frozenset((str, int, bool, type(None)))
# Where an integer may be past 64 bits (in a string or a float too: those just go the
# standard library's way).
_LONG_DIGITS = re.compile(r"[0-9]{19}")


def dumps(value: Any) -> str:
    """``value`` as compact JSON text, non-ASCII characters as they are; ``TypeError`` or
    ``ValueError`` (NaN, infinities, a circular reference) as :func:`json.dumps` raises."""
    if orjson is not None and _written_alike(value, 0):
        try:
            return orjson.dumps(value).decode()
        except orjson.JSONEncodeError:
            pass  # e.g. an integer past 64 bits: the standard library writes it
    return _ENCODER.encode(value)


def loads(text: str) -> Any:
    """The value of JSON ``text``; ``ValueError`` when it is not JSON."""
    if orjson is not None and _LONG_DIGITS.search(text) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass  # a number or a nesting orjson does not take; the standard library does
    return json.loads(text)


def _written_alike(value: Any, depth: int) -> bool:
    """Whether orjson writes ``value`` as the standard library does (see the module's text).
    The scalars inside a dict or a list are checked in its loop: a call less for each."""
    kind = type(value)
    if kind is dict:
        if depth >= _MAX_DEPTH:
            return False
        for key, item in value.items():
            if type(key) is not str:
                return False
            if type(item) not in _SCALARS and not _written_alike(item, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        if depth >= _MAX_DEPTH:
            return False
        for item in value:
            if type(item) not in _SCALARS and not _written_alike(item, depth + 1):
                return False
        return True
    if kind is float:
        return bool(value - value == 0.0)  # NaN and infinities give NaN
    return kind in _SCALARS
