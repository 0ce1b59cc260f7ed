"""Timestamps sent as microseconds since the epoch, loaded as Django would load them.

Django's text loader for ``timestamptz`` parses every value; the hot paths (a claim's rows,
an enqueue's result) send integers instead and convert them here, once per distinct value.
"""

from __future__ import annotations

import functools
import zoneinfo
from datetime import UTC, datetime, timedelta, tzinfo

from django.conf import settings
from django.db import connections


@functools.lru_cache(maxsize=16)
def _zone(name: str) -> tzinfo:
    return zoneinfo.ZoneInfo(name)


class TimestampLoader:
    """Timestamps (microseconds since the epoch) as Django would have loaded them:
    aware in UTC, or naive in the connection's time zone when ``USE_TZ = False``.

    One loader serves one batch: its leases share ``leased_at`` and ``available_at`` (and a
    bulk enqueue's ``enqueued_at``), so each distinct value is converted once.
    ``fromtimestamp`` rounds to the nearest microsecond and ``micros / 1e6`` is within 0.2 us
    of the exact value until the year 2200, so the result is exact; later times (a message
    scheduled far ahead) take the slower exact sum.
    """

    def __init__(self, alias: str) -> None:
        self.naive_in = None if settings.USE_TZ else _zone(connections[alias].timezone_name)
        self.seen: dict[int, datetime] = {}

    def __call__(self, micros: int | None) -> datetime | None:
        if micros is None:
            return None
        moment = self.seen.get(micros)
        if moment is None:
            if -_FLOAT_EXACT_MICROS < micros < _FLOAT_EXACT_MICROS:
                moment = datetime.fromtimestamp(micros / 1e6, UTC)
            else:
                moment = _EPOCH + timedelta(microseconds=micros)
            if self.naive_in is not None:
                moment = moment.astimezone(self.naive_in).replace(tzinfo=None)
            self.seen[micros] = moment
        return moment


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# 2200-01-01 UTC: up to there a float of seconds keeps every microsecond.
_FLOAT_EXACT_MICROS = 7_258_118_400_000_000
