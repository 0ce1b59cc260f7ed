"""``manage.py pgq_prune``: expire archived and dead messages now, as the retention settings say.

Exits 1 when another run holds the lock, or when a step could not run (one line each on
stderr, a missing privilege named): the steps that could run have run.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...core._retention import run_retention


class Command(BaseCommand):
    help = (
        "Expire archived and dead messages past ARCHIVE_RETENTION / DEAD_RETENTION (and their "
        "per-queue overrides) now: whole archive days are dropped, shorter per-queue "
        "retentions and dead messages deleted in batches; also creates the archive's day "
        "partitions ahead. Workers do the same every RETENTION_INTERVAL; this is the one-off. "
        "Exits 1 when a step could not run (a missing privilege), after the others ran."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Change nothing; print what would be dropped or deleted, with row counts.",
        )
        parser.add_argument(
            "--source",
            action="append",
            choices=["archive", "dead"],
            dest="sources",
            help="Only this table (repeatable). Default: both, and job control's expired unique "
            "windows and the progress rows of messages no longer live.",
        )
        only = parser.add_mutually_exclusive_group()
        only.add_argument(
            "--partitions-only",
            action="store_true",
            help="Only create the archive's days ahead and drop the expired days (DDL: run it "
            "as the table's owner, e.g. daily from cron, when the workers' role has DML only).",
        )
        only.add_argument(
            "--rows-only",
            action="store_true",
            help="Only delete expired rows in batches (DML: what a role without DDL may do).",
        )
        parser.add_argument("--json", action="store_true", help="Print one JSON document.")
        parser.add_argument(
            "--database",
            help="Database alias (default: PGQUEUE's); e.g. an alias that connects as the owner.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        sources = tuple(options["sources"] or ("archive", "dead"))
        report = run_retention(
            # Job control's expired windows and orphaned progress go with a run of both.
            housekeeping=not options["sources"],
            using=options["database"],
            dry_run=options["dry_run"],
            sources=sources,
            partitions=not options["rows_only"],
            rows=not options["partitions_only"],
        )
        if options["json"]:
            self.stdout.write(json.dumps(report.as_json(), indent=2))
        else:
            if report.dry_run:
                self.stdout.write("Dry run: nothing is changed.")
            for line in report.lines():
                self.stdout.write(line)
            if not report.busy:
                verb = "would expire" if report.dry_run else "expired"
                self.stdout.write(f"{verb} {report.rows_expired:,} rows in {report.seconds:.2f}s")
        if report.busy:
            raise CommandError("another retention run holds the lock; try again later")
        if len(report.problems) == 1:
            raise CommandError(report.problems[0])
        if report.problems:
            raise CommandError(
                f"{len(report.problems)} steps could not run:\n"
                + "\n".join(f"  {line}" for line in report.problems)
            )
