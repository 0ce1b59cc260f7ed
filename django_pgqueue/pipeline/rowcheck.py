"""One input row of a bulk enqueue, checked by the rules of ``enqueue()``.

Kept apart and light (no models, no database): Spark's Python workers import it.
"""

from __future__ import annotations

import json
from typing import Any

from ..core._validation import (
    DEDUP_KEY_MAX_LENGTH,
    TENANT_MAX_LENGTH,
    encode_payload,
    validate_optional_key,
    validate_priority,
)
from ..exceptions import InvalidMessage


def check_row(
    text: str | None,
    key: str | None,
    raw_priority: str | None,
    tenant: str | None,
    corrupt: str | None,
    *,
    wrapped: bool,
    default_priority: int,
    max_bytes: int,
) -> tuple[Any, ...]:
    """(payload JSON, dedup key, priority, tenant, None) or (None x 4, the reason)."""
    try:
        if corrupt is not None:
            raise InvalidMessage(f"malformed record: {corrupt[:200]!r}")
        value: Any = None
        if text is not None:
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise InvalidMessage(f"payload is not valid JSON: {exc}") from exc
            if wrapped:
                value = value.get("v")
        payload_json = encode_payload(value, max_bytes)
        key = validate_optional_key(key, "dedup_key", DEDUP_KEY_MAX_LENGTH)
        priority: Any = default_priority
        if raw_priority is not None:
            try:
                priority = int(raw_priority)
            except ValueError:
                priority = raw_priority
        priority = validate_priority(priority)
        tenant = validate_optional_key(tenant, "tenant", TENANT_MAX_LENGTH)
    except InvalidMessage as exc:
        return (None, None, None, None, str(exc))
    return (payload_json, key, priority, tenant, None)
