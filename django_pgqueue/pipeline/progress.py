"""Progress a person can follow: rows done, rows/s, ranges (or partitions) left."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Progress:
    """Counts one job's work and reports it through ``report`` after every step."""

    job: str
    total_steps: int
    report: Callable[[str], None] | None = None
    steps_done: int = 0
    rows_done: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def rows_per_second(self) -> float:
        elapsed = self.elapsed
        return self.rows_done / elapsed if elapsed > 0 else 0.0

    @property
    def steps_left(self) -> int:
        return max(self.total_steps - self.steps_done, 0)

    def add_steps(self, steps: int) -> None:
        self.total_steps += steps

    def advance(self, rows: int, steps: int = 1, note: str = "") -> None:
        self.rows_done += rows
        self.steps_done += steps
        if self.report is not None:
            self.report(self.line(note))

    def line(self, note: str = "") -> str:
        text = (
            f"{self.job}: {self.rows_done:,} rows, {self.rows_per_second:,.0f} rows/s, "
            f"{self.steps_done}/{self.total_steps} ranges done, {self.steps_left} left, "
            f"{self.elapsed:.1f}s"
        )
        return f"{text} ({note})" if note else text


class Writer(Protocol):
    def write(self, text: str, /) -> Any: ...


def printer(stream: Writer | None = None) -> Callable[[str], None]:
    """A ``report`` callback that writes one line per step and flushes (visible under pipes)."""
    out: Writer = stream or sys.stderr

    def write(line: str) -> None:
        out.write(line + "\n")
        flush = getattr(out, "flush", None)
        if flush is not None:
            flush()

    return write
