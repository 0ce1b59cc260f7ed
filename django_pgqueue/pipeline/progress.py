"""Progress a person can follow: rows done, rows/s, ranges (or passes) left, and what the
running Spark job has done so far."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Seconds between two reports of a running Spark job.
WATCH_INTERVAL = 5.0


@dataclass
class Progress:
    """Counts one job's work and reports it through ``report`` after every step."""

    job: str
    total_steps: int
    report: Callable[[str], None] | None = None
    unit: str = "ranges"
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

    def say(self, note: str) -> None:
        """Report where the job is without counting a step done."""
        if self.report is not None:
            self.report(self.line(note))

    def line(self, note: str = "") -> str:
        text = (
            f"{self.job}: {self.rows_done:,} rows, {self.rows_per_second:,.0f} rows/s, "
            f"{self.steps_done}/{self.total_steps} {self.unit} done, {self.steps_left} left, "
            f"{self.elapsed:.1f}s"
        )
        return f"{text} ({note})" if note else text


class SparkJobWatch:
    """While the block runs, reports every ``interval`` seconds how many tasks (partitions)
    of the Spark jobs started in it are done: a long job is never silent until its end.

    The jobs are found by a job group set on the calling thread, so jobs of other threads
    sharing the session are not counted.
    """

    def __init__(
        self,
        spark: SparkSession,
        progress: Progress,
        what: str,
        interval: float | None = None,
    ) -> None:
        self.context = spark.sparkContext
        self.progress = progress
        self.what = what
        self.interval = WATCH_INTERVAL if interval is None else interval
        self.group = f"pgq-{uuid.uuid4().hex}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pgq-progress", daemon=True)

    def tasks(self) -> tuple[int, int]:
        """(tasks done, tasks in all) over the stages of this block's jobs so far."""
        tracker = self.context.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        return done, total

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                done, total = self.tasks()
            except Exception:  # a report must never break the job it watches
                continue
            if total:
                self.progress.say(f"{self.what}: {done}/{total} partitions done")

    def __enter__(self) -> SparkJobWatch:
        if self.progress.report is not None:
            self.context.setJobGroup(self.group, self.what)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self.context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            self.context.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]


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
