"""Message headers: a small dict of strings carried beside the payload (trace context, a
request id), checked at enqueue and stored as JSON in the ``headers`` column (NULL when
there are none, so that a message without headers costs nothing more)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ..exceptions import InvalidMessage
from ._validation import _CONTROL_RE

__all__ = [
    "HEADERS_MAX_BYTES",
    "HEADERS_MAX_KEYS",
    "HEADER_KEY_MAX_LENGTH",
    "HEADER_VALUE_MAX_LENGTH",
    "decode_headers",
    "encode_headers",
    "validate_headers",
]

HEADERS_MAX_KEYS = 32
HEADER_KEY_MAX_LENGTH = 64
HEADER_VALUE_MAX_LENGTH = 1024
#: The size of the headers' JSON text, in UTF-8 bytes.
HEADERS_MAX_BYTES = 8192
_KEY_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")


def validate_headers(headers: object) -> dict[str, str] | None:
    """``headers`` checked and copied, ``None`` for none (``None`` or empty); else
    :class:`InvalidMessage` naming the first thing wrong."""
    if headers is None:
        return None
    if not isinstance(headers, Mapping):
        raise InvalidMessage(f"headers must be a dict of strings, not {type(headers).__name__}")
    if not headers:
        return None
    if len(headers) > HEADERS_MAX_KEYS:
        raise InvalidMessage(
            f"headers has {len(headers)} keys, over the {HEADERS_MAX_KEYS} allowed"
        )
    checked: dict[str, str] = {}
    for key, value in headers.items():
        if not isinstance(key, str):
            raise InvalidMessage(f"header key {key!r} must be a str, not {type(key).__name__}")
        if not _KEY_RE.fullmatch(key):
            raise InvalidMessage(
                f"header key {key[:80]!r} must be 1 to {HEADER_KEY_MAX_LENGTH} characters of "
                "A-Z, a-z, 0-9, '.', '_' and '-'"
            )
        if not isinstance(value, str):
            raise InvalidMessage(
                f"header {key!r} must have a str value, not {type(value).__name__}"
            )
        if len(value) > HEADER_VALUE_MAX_LENGTH:
            raise InvalidMessage(
                f"header {key!r} is {len(value)} characters, over the {HEADER_VALUE_MAX_LENGTH} "
                "allowed"
            )
        found = _CONTROL_RE.search(value)
        if found is not None:
            raise InvalidMessage(
                f"header {key!r} contains the control character U+{ord(found.group()):04X}"
            )
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidMessage(
                f"header {key!r} contains a lone surrogate (U+{ord(value[exc.start]):04X})"
            ) from None
        checked[key] = value
    size = len(_encode(checked).encode("utf-8"))
    if size > HEADERS_MAX_BYTES:
        raise InvalidMessage(
            f"headers are {size} bytes of JSON, over the {HEADERS_MAX_BYTES} allowed"
        )
    return checked


def encode_headers(headers: Mapping[str, str] | None) -> str | None:
    """Checked headers as the column's JSON text (``None``: NULL)."""
    return _encode(headers) if headers else None


def _encode(headers: Mapping[str, str]) -> str:
    return json.dumps(headers, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def decode_headers(value: Any) -> dict[str, str]:
    """A ``headers`` column as read (NULL, JSON text or already decoded) as a dict."""
    if value is None:
        return {}
    if isinstance(value, str):
        decoded: dict[str, str] = json.loads(value)
        return decoded
    return dict(value)
