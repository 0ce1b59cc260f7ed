"""One ``/metrics`` for a group of worker processes: their text expositions, summed.

A supervisor (``pgq_worker --processes N``) scrapes each child's ``/metrics`` and answers
with one exposition in which samples of the same name and labels are added up: processed,
failed, retried counters and handler-duration histograms of the whole group, ``in_flight``
and ``concurrency`` of the group. Two exceptions: a gauge listed in :data:`MAX_GAUGES` (the
database silence) is the largest child's value, and each child's ``pgqueue_worker_info``
sample stays its own (its ``worker_id`` label differs).

Counters never go backwards when a child exits (a crash, a recycle): the last values read
from it are kept as *retired* and added to every later answer, so ``rate()`` sees no reset.
What a child counted after its last scrape and before it exited is not seen (a small
undercount, never a double count).

Only the text format ``prometheus_client`` writes is read (no timestamps, one sample a
line); the standard library suffices: each sample is keyed by its ``name{labels}`` text,
which one version of the package writes identically in every child.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

#: Gauges whose group value is the largest child's, not the sum.
MAX_GAUGES = frozenset({"pgqueue_worker_database_silence_seconds"})
#: Family types whose samples only grow: kept when their child exits.
_CUMULATIVE = frozenset({"counter", "histogram", "summary"})


@dataclass
class Family:
    name: str
    type: str = "untyped"
    help: str = ""
    #: ``name{labels}`` -> value, in the order first seen.
    samples: dict[str, float] = field(default_factory=dict)


def parse(text: str) -> dict[str, Family]:
    """The families of one exposition, by name, in their order."""
    families: dict[str, Family] = {}
    current: Family | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                if parts[2].endswith("_created"):
                    current = None  # creation times: never summed
                    continue
                family = families.setdefault(parts[2], Family(parts[2]))
                if parts[1] == "HELP":
                    family.help = parts[3] if len(parts) > 3 else ""
                else:
                    family.type = parts[3].strip() if len(parts) > 3 else "untyped"
                current = family
            continue
        key, _, value = line.rpartition(" ")
        if not key:
            continue
        name = key.split("{", 1)[0]
        if name.endswith("_created"):
            continue  # a creation time: never summed
        if current is None or not _belongs(key, current.name):
            current = families.setdefault(name, Family(name))
        try:
            current.samples[key] = float(value)
        except ValueError:
            continue
    return families


def _belongs(key: str, family: str) -> bool:
    return key.split("{", 1)[0].startswith(family)


def combine(expositions: list[dict[str, Family]]) -> dict[str, Family]:
    """The group's families: samples of the same key summed (the largest for MAX_GAUGES)."""
    merged: dict[str, Family] = {}
    for families in expositions:
        for name, family in families.items():
            target = merged.setdefault(name, Family(name, family.type, family.help))
            for key, value in family.samples.items():
                if key not in target.samples:
                    target.samples[key] = value
                elif name in MAX_GAUGES:
                    target.samples[key] = max(target.samples[key], value)
                else:
                    target.samples[key] += value
    return merged


def render(families: dict[str, Family]) -> bytes:
    lines: list[str] = []
    for family in families.values():
        if family.help:
            lines.append(f"# HELP {family.name} {family.help}")
        lines.append(f"# TYPE {family.name} {family.type}")
        lines.extend(f"{key} {_number(value)}" for key, value in family.samples.items())
    return ("\n".join(lines) + "\n").encode()


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(int(value)) + ".0" if value.is_integer() else repr(value)


class GroupMetrics:
    """The children's last expositions and the retired counters of those that exited."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, dict[str, Family]] = {}
        self._retired: dict[str, Family] = {}

    def scraped(self, child: str, text: str) -> dict[str, Family]:
        families = parse(text)
        with self._lock:
            self._last[child] = families
        return families

    def retire(self, child: str) -> None:
        """``child`` exited: its counters and histograms stay in the group's totals."""
        with self._lock:
            families = self._last.pop(child, None)
            if families is None:
                return
            cumulative = {n: f for n, f in families.items() if f.type in _CUMULATIVE}
            self._retired = combine([self._retired, cumulative])

    def exposition(self, live: list[dict[str, Family]], own: dict[str, Family]) -> bytes:
        """The children scraped now, the retired totals and the supervisor's ``own``."""
        with self._lock:
            retired = self._retired
        return render(combine([*live, retired, own]))
