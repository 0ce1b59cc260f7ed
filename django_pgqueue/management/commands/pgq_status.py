"""``manage.py pgq_status``: the queues and workers at a glance; non-zero past a threshold."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...admin.display import short_duration
from ...core._validation import printable, validate_queue_name
from ...exceptions import QueueNameError
from ...status import Status, Thresholds, read_status

#: The exit code when a threshold is crossed (1 is any other error, bad usage included).
THRESHOLD_EXIT_CODE = 2
#: argparse's own exit code for bad usage, which would read as a crossed threshold.
ARGPARSE_USAGE_CODE = 2


class _UsageExitsOne(CommandParser):
    """A parser whose usage errors exit 1: a typo in a cron line must not look like an alert."""

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        super().exit(1 if status == ARGPARSE_USAGE_CODE else status, message)


def _non_negative_float(value: str) -> float:
    number = float(value)
    if not number >= 0:
        raise ValueError(value)
    return number


def _non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError(value)
    return number


# A batch's label is the application's text: one line of the table, cut to this length.
LABEL_WIDTH = 40


def _printable(text: str) -> str:
    """One line of printable characters (a label cannot forge lines of the report)."""
    shown = "".join(c if c.isprintable() else "?" for c in text)
    return shown if len(shown) <= LABEL_WIDTH else shown[: LABEL_WIDTH - 1] + "…"


class Command(BaseCommand):
    help = (
        "Show each queue's ready / scheduled / in-flight / dead messages (capped counts), the "
        "age of its oldest ready message, dead messages by reason, messages waiting on "
        "dependencies or a batch, the newest open batches and the live workers. Exits "
        f"{THRESHOLD_EXIT_CODE} when a --max-*/--min-* threshold is crossed (for cron alerts)."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # Django builds its CommandParser itself; only the exit code changes.
        parser.__class__ = _UsageExitsOne
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            default=[],
            metavar="NAME",
            help="Only this queue (repeatable). Default: every known queue.",
        )
        parser.add_argument("--json", action="store_true", help="Print one JSON document.")
        parser.add_argument(
            "--max-oldest-ready",
            type=_non_negative_float,
            metavar="SECONDS",
            help="Alert when a ready message of an unpaused queue has waited longer.",
        )
        parser.add_argument(
            "--max-dead",
            type=_non_negative_int,
            metavar="N",
            help="Alert when a queue holds more than N dead messages.",
        )
        parser.add_argument(
            "--min-workers",
            type=_non_negative_int,
            metavar="N",
            help="Alert when fewer than N workers have a recent heartbeat.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            queues = [validate_queue_name(q) for q in options["queues"]]
        except QueueNameError as exc:
            raise CommandError(str(exc)) from exc
        status = read_status(
            queues=queues,
            thresholds=Thresholds(
                max_oldest_ready=options["max_oldest_ready"],
                max_dead=options["max_dead"],
                min_workers=options["min_workers"],
            ),
        )
        if options["json"]:
            self.stdout.write(json.dumps(status.as_json(), indent=2))
        else:
            self._write_text(status)
        if status.problems:
            raise CommandError("; ".join(status.problems), returncode=THRESHOLD_EXIT_CODE)

    def _write_text(self, status: Status) -> None:
        overview = status.overview
        self.stdout.write(f"Queues at {overview.now:%Y-%m-%d %H:%M:%S %Z} (database time)")
        header = ("queue", "paused", "ready", "scheduled", "in flight", "dead", "oldest ready")
        rows = [header]
        for q in overview.queues:
            oldest = short_duration(q.oldest_ready_age) if q.oldest_ready_age else "-"
            rows.append(
                (
                    q.name,
                    "yes" if q.paused else "no",
                    str(q.ready),
                    str(q.scheduled),
                    str(q.in_flight),
                    str(q.dead),
                    oldest,
                )
            )
        if len(rows) == 1:
            self.stdout.write("  (no queue has messages, a state row or a worker)")
        else:
            widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
            for row in rows:
                self.stdout.write(
                    "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                )
        if status.dead_by_reason:
            self.stdout.write("Dead by reason:")
            for queue, reasons in status.dead_by_reason.items():
                text = ", ".join(f"{reason} {count:,}" for reason, count in reasons.items())
                self.stdout.write(f"  {queue}: {text}")
        if status.waiting:
            self.stdout.write("Waiting on dependencies or a batch:")
            for queue, count in status.waiting.items():
                self.stdout.write(f"  {queue}: {count}")
        self._write_batches(status)
        self.stdout.write(f"Live workers: {len(overview.workers)}")
        for w in overview.workers:
            served = ", ".join(w.queues) if w.queues else "all queues"
            self.stdout.write(
                f"  {w.worker_id}  {served}  concurrency {w.concurrency}  "
                f"seen {short_duration(w.seen_ago)} ago  processed {w.stats.get('processed', 0)}"
            )
        if status.progress:
            self.stdout.write("Progress of running messages:")
            for running in status.progress:
                progress = running.progress
                self.stdout.write(
                    f"  #{progress.message_id} {printable(running.task)} on {running.queue}: "
                    f"{printable(progress.text())}, "
                    f"reported {short_duration(timedelta(seconds=running.age_seconds))} ago"
                )
        if status.problems:
            self.stdout.write("Problems:")
            for problem in status.problems:
                self.stdout.write(f"  {problem}")

    def _write_batches(self, status: Status) -> None:
        if not status.open_batch_count.value:
            return
        shown = len(status.open_batches)
        newest = f" (the newest {shown})" if status.open_batch_count.value > shown else ""
        self.stdout.write(f"Open batches: {status.open_batch_count}{newest}")
        header = ("batch", "label", "done", "failed", "total")
        rows = [header]
        for batch in status.open_batches:
            rows.append(
                (
                    str(batch.id),
                    _printable(batch.label) or "-",
                    f"{batch.succeeded:,}",
                    f"{batch.failed:,}",
                    f"{batch.total:,}",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        for row in rows:
            cells = zip(row, widths, strict=True)
            self.stdout.write("  " + "  ".join(c.ljust(w) for c, w in cells).rstrip())
