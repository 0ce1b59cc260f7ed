"""``manage.py pgq_pipeline {export,stats,prune,enqueue}``: a thin shell over
:mod:`django_pgqueue.pipeline` (needs the ``spark`` extra, except for prune)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...cli import add_arguments, run


class Command(BaseCommand):
    help = (
        "The data pipeline on Spark: export the archive to Parquet, compute hourly stats, "
        "prune verified rows, bulk-enqueue a file. See docs/how-to/pipeline.md."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        status = run(options, self.stdout, self.stderr)
        if status:
            raise CommandError(f"pgq_pipeline {options['job']} failed", returncode=status)
