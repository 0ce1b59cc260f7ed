"""The command line of the pipeline jobs, shared by ``manage.py pgq_pipeline`` and
``python -m django_pgqueue.pipeline`` (which ``spark-submit`` can run as well)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..conf import get_settings
from ..exceptions import BadInput, PipelineError
from .committed import check_file_mode, local_directory
from .progress import Writer, printer
from .session import SECRET_KEY

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .export import ExportResult

LEAN_LOCAL_EXPORT_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master URL: local[*] (default, embedded), local[N], spark://host:7077, "
        "yarn, k8s://https://host:port. Under spark-submit, its --master is used.",
    )
    parser.add_argument(
        "--database",
        default=None,
        help="Django DATABASES alias holding the queue (default: PGQUEUE['DATABASE_ALIAS']).",
    )
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Extra Spark configuration, repeatable (e.g. spark.driver.memory=2g). Visible "
        "in the process list: put secrets in --spark-conf-file instead.",
    )
    parser.add_argument(
        "--spark-conf-file",
        default=None,
        metavar="PATH",
        help="Spark properties file (`key value` or `key=value` lines, like "
        "spark-defaults.conf), for secrets: its values never appear in a command line.",
    )
    parser.add_argument("--json", action="store_true", help="Print the result as JSON.")
    jobs = parser.add_subparsers(
        dest="job", required=True, metavar="{export,compact,stats,prune,enqueue}"
    )

    export = jobs.add_parser("export", help="Archive and dead rows -> Parquet (queue/day).")
    export.add_argument("destination", help="Local path or Hadoop-compatible URL (s3a://...).")
    export.add_argument(
        "--source", action="append", choices=["archive", "dead"], help="Default: both."
    )
    export.add_argument("--range-size", type=int, default=50_000, help="Ids per range.")
    export.add_argument(
        "--ranges-per-job",
        type=int,
        default=None,
        help="Ranges per Spark job (default: 4 x the cluster's default parallelism).",
    )
    export.add_argument(
        "--max-ranges",
        type=_max_ranges,
        default=None,
        metavar="N",
        help="Export at most N ranges of each source, oldest first; the rest waits for the "
        "next run (default: all). With --every, it bounds the export's pace: a backlog is "
        "caught up N ranges per pass.",
    )
    export.add_argument(
        "--horizon-wait",
        type=float,
        default=30.0,
        help="Seconds to wait for transactions older than the export start (see docs).",
    )
    export.add_argument(
        "--file-mode",
        type=_octal_mode,
        default="600",
        help="Permissions of the Parquet files, octal (default 600, owner only; directories "
        "get the matching 700). E.g. 640 to let the group read.",
    )
    export.add_argument(
        "--lease-seconds",
        type=float,
        default=60.0,
        help="Length of the destination's writer lease, renewed while the run works; a killed "
        "run's lease expires after it and the next run takes over (default 60).",
    )
    export.add_argument(
        "--every",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="Keep running: a pass every SECONDS, all in one Spark session (one JVM start, not "
        "one per pass). SIGTERM or SIGINT stops it after the running pass.",
    )

    compact = jobs.add_parser(
        "compact", help="Merge the small files of consecutive committed export ranges."
    )
    compact.add_argument(
        "destination",
        help="Path or URL of the export; a local path is merged without Spark, any other URL "
        "(s3a://, hdfs://...) through Spark.",
    )
    compact.add_argument(
        "--source", action="append", choices=["archive", "dead"], help="Default: both."
    )
    compact.add_argument(
        "--target-rows",
        type=int,
        default=1_000_000,
        help="Rows per merged range at most (default 1,000,000).",
    )
    compact.add_argument(
        "--retain-hours",
        type=int,
        default=None,
        metavar="HOURS",
        help="Vacuum: delete the files only table versions older than HOURS hold (default: "
        "the table's delta.deletedFileRetentionDuration, 7 days).",
    )
    compact.add_argument(
        "--file-mode", type=_octal_mode, default="600", help="As for export (default 600)."
    )

    stats = jobs.add_parser("stats", help="Hourly stats per queue and task -> stats table.")
    stats.add_argument("--hours", type=int, default=24, help="Window: the last N hours.")
    stats.add_argument("--since", type=_aware, help="Window start (ISO 8601 with offset).")
    stats.add_argument("--until", type=_aware, help="Window end, exclusive.")

    prune = jobs.add_parser(
        "prune", help="Delete rows that an export holds, after re-verifying its files."
    )
    prune.add_argument(
        "--destination",
        required=True,
        help="The export whose committed files are re-verified before their rows are deleted.",
    )
    prune.add_argument("--source", action="append", choices=["archive", "dead"])
    prune.add_argument("--keep-days", type=float, default=None, help="Keep the last N days.")
    prune.add_argument("--vacuum", action="store_true", help="VACUUM (ANALYZE) afterwards.")
    prune.add_argument(
        "--dry-run", action="store_true", help="Re-verify and report; delete nothing."
    )

    enqueue = jobs.add_parser("enqueue", help="Bulk-enqueue a Parquet/CSV/JSON path.")
    enqueue.add_argument("path", help="Input path or URL.")
    enqueue.add_argument("--task", required=True)
    enqueue.add_argument("--queue", default=None)
    enqueue.add_argument("--format", choices=["parquet", "csv", "json"], default=None)
    enqueue.add_argument("--payload-column", default=None)
    enqueue.add_argument("--dedup-key-column", default=None)
    enqueue.add_argument("--priority-column", default=None)
    enqueue.add_argument("--tenant-column", default=None)
    enqueue.add_argument(
        "--drop-mapped-columns",
        action="store_true",
        help="Leave the dedup key, priority and tenant columns out of the payload "
        "(default: the payload holds every input column).",
    )
    enqueue.add_argument("--priority", type=int, default=0)
    enqueue.add_argument("--max-attempts", type=int, default=None)
    enqueue.add_argument("--batch-id", default=None, help="Default: derived from path/task/queue.")
    enqueue.add_argument(
        "--skip-bad",
        action="store_true",
        help="Enqueue the valid rows when some are invalid (exit status 2 when none is).",
    )
    enqueue.add_argument(
        "--no-history-check",
        action="store_true",
        help="Do not skip dedup keys already archived or dead.",
    )


def _octal_mode(value: str) -> int:
    try:
        return check_file_mode(int(value, 8))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an octal mode such as 600") from None
    except PipelineError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(value: str) -> float:
    from .follow import check_every

    try:
        return check_every(float(value))
    except (ValueError, PipelineError):
        raise argparse.ArgumentTypeError(
            f"a number of seconds > 0 (e.g. 30), not {value!r}"
        ) from None


def _max_ranges(value: str) -> int:
    from .export import check_max_ranges

    try:
        number = int(value)
        check_max_ranges(number)
    except (ValueError, PipelineError):
        raise argparse.ArgumentTypeError(f"a whole number >= 1, not {value!r}") from None
    return number


def _aware(value: str) -> datetime:
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{value!r} has no UTC offset (e.g. +00:00)")
    return moment


def run(options: dict[str, Any], out: Writer, err: Writer) -> int:
    """Run one job; returns the exit status. Progress goes to ``err``, the result to ``out``."""
    from .session import build_session

    report = printer(err)
    job = options["job"]
    try:
        alias = options.get("database")
        check_database(alias)
        if job == "prune":  # no Spark needed: deletes run from the driver
            from .prune import prune

            result: Any = prune(
                destination=options.get("destination"),
                sources=options.get("source") or ["archive", "dead"],
                keep_days=options.get("keep_days"),
                vacuum=options.get("vacuum", False),
                dry_run=options.get("dry_run", False),
                report=report,
                using=options.get("database"),
            )
            summary = {
                "destination": result.destination,
                "dry_run": result.dry_run,
                "rows": result.rows,
                "row_bytes": result.row_bytes,
                "ranges_pruned": result.ranges_pruned,
                "relation_bytes_before": result.relation_bytes_before,
                "relation_bytes_after": result.relation_bytes_after,
                "vacuumed": result.vacuumed,
                "vacuum_skipped": result.vacuum_skipped,
                "refused": result.refused,
                "skipped": result.skipped,
                "seconds": round(result.seconds, 3),
            }
            return _emit(
                options,
                out,
                summary,
                prune_text(result),
                1 if result.refused or result.skipped else 0,
            )
        if job == "compact" and local_directory(options["destination"]) is not None:
            # No Spark needed: the driver merges local files with pyarrow.
            return _compact(options, out, report, alias, None)
        if job == "export":
            return _export_command(options, out, err, report, alias)
        conf = spark_conf(options.get("spark_conf") or [], err)
        if job == "enqueue":  # refuse bad arguments before paying for Spark's start
            from .enqueue import check_batch_id, check_target, input_format

            check_target(
                task=options["task"],
                queue=options.get("queue"),
                priority=options.get("priority") or 0,
                max_attempts=options.get("max_attempts"),
            )
            if options.get("batch_id") is not None:
                check_batch_id(options["batch_id"])
            input_format(options["path"], options.get("format"))
        spark = build_session(
            options.get("master"),
            app_name=f"pgq_pipeline {job}",
            conf=conf,
            conf_file=options.get("spark_conf_file"),
        )
        if job == "compact":
            return _compact(options, out, report, alias, spark)
        if job == "stats":
            from .stats import stats

            computed = stats(
                spark,
                hours=options.get("hours") or 24,
                since=options.get("since"),
                until=options.get("until"),
                report=report,
                using=options.get("database"),
            )
            summary = {
                "since": computed.since.isoformat(),
                "until": computed.until.isoformat(),
                "rows_read": computed.rows_read,
                "groups": computed.groups,
                "seconds": round(computed.seconds, 3),
            }
            text = (
                f"stats {computed.since:%Y-%m-%d %H:00} -> {computed.until:%Y-%m-%d %H:00} UTC: "
                f"{computed.rows_read:,} rows, {computed.groups} queue/task/hour rows written"
            )
            return _emit(options, out, summary, text, 0)
        from .enqueue import enqueue_frame

        enqueued = enqueue_frame(
            spark,
            options["path"],
            task=options["task"],
            queue=options.get("queue"),
            input_format=options.get("format"),
            payload_column=options.get("payload_column"),
            dedup_key_column=options.get("dedup_key_column"),
            priority_column=options.get("priority_column"),
            tenant_column=options.get("tenant_column"),
            drop_mapped_columns=options.get("drop_mapped_columns", False),
            priority=options.get("priority") or 0,
            max_attempts=options.get("max_attempts"),
            batch_id=options.get("batch_id"),
            skip_bad=options.get("skip_bad", False),
            check_history=not options.get("no_history_check", False),
            report=report,
            using=options.get("database"),
        )
        summary = {
            "batch_id": enqueued.batch_id,
            "rows": enqueued.rows,
            "enqueued": enqueued.enqueued,
            "duplicates": enqueued.duplicates,
            "bad": enqueued.bad_count,
            "bad_rows": enqueued.bad_rows,
            "partitions": enqueued.partitions,
            "seconds": round(enqueued.seconds, 3),
        }
        text = (
            f"enqueued {enqueued.enqueued:,} of {enqueued.rows:,} rows (batch "
            f"{enqueued.batch_id}): {enqueued.duplicates:,} duplicates (enqueued before, or "
            f"repeated in the input), {enqueued.bad_count:,} invalid and skipped"
        )
        for number, reason in enqueued.bad_rows:
            text += f"\n  row {number}: {reason}"
        if enqueued.bad_count:
            err.write(f"warning: skipped {enqueued.bad_count:,} invalid rows\n")
        return _emit(options, out, summary, text, 0)
    except BadInput as exc:
        err.write(f"error: {exc}\n")
        if options.get("json"):
            out.write(json.dumps({"error": str(exc), "bad_rows": exc.bad_rows}) + "\n")
        return 2
    except PipelineError as exc:
        err.write(f"error: {exc}\n")
        return 2


def _export_command(
    options: dict[str, Any], out: Writer, err: Writer, report: Any, alias: str | None
) -> int:
    """One export pass, or (``--every``) one pass after another sharing one SparkSession."""
    from .session import build_session

    conf = spark_conf(options.get("spark_conf") or [], err)
    if (options.get("master") or "local").startswith("local"):
        # Embedded export: Python tasks do the work, the JVM only schedules them, so a
        # JVM that starts lean (no UI, no optimizing JIT) is time won. --spark-conf wins.
        conf = {**LEAN_LOCAL_EXPORT_CONF, **conf}
    destination = options["destination"]
    database = alias or get_settings().DATABASE_ALIAS
    sessions: list[SparkSession] = []  # started by the first pass with work, then kept

    def export_pass() -> int:
        from .export import export, nothing_to_export
        from .lease import refuse_if_held

        sources = options.get("source") or ["archive", "dead"]
        if nothing_to_export(destination, sources, alias):
            # Decided from PostgreSQL alone: no Spark start-up for a pass with nothing to do.
            summary: dict[str, Any] = {
                "run": None,
                "rows": 0,
                "ranges": 0,
                "verified": 0,
                "ids_left": 0,
                "mismatched": [],
            }
            return _emit(
                options, out, summary, f"export: nothing new to export to {destination}", 0
            )
        refuse_if_held(destination, database)
        if not sessions:
            sessions.append(
                build_session(
                    options.get("master"),
                    app_name="pgq_pipeline export",
                    conf=conf,
                    conf_file=options.get("spark_conf_file"),
                )
            )
        spark = sessions[0]
        exported = export(
            spark,
            destination,
            sources=sources,
            range_size=options.get("range_size") or 50_000,
            ranges_per_job=options.get("ranges_per_job"),
            max_ranges=options.get("max_ranges"),
            horizon_wait=options.get("horizon_wait", 30.0),
            report=report,
            using=options.get("database"),
            master=str(spark.sparkContext.master),
            file_mode=options.get("file_mode") or 0o600,
            lease_seconds=options.get("lease_seconds") or 60.0,
        )
        return _emit(
            options,
            out,
            export_summary(exported),
            export_text(exported),
            1 if exported.mismatched else 0,
        )

    every = options.get("every")
    if every is None:
        return export_pass()
    from .follow import follow

    # A pass with mismatched ranges is not an end: the next pass exports them again.
    return follow(export_pass, every, alias=database, report=report)


def export_summary(exported: ExportResult) -> dict[str, Any]:
    return {
        "run": exported.run_id,
        "rows": exported.rows_exported,
        "ranges": exported.ranges_exported,
        "verified": exported.ranges_verified,
        "ids_left": exported.ids_left,
        "mismatched": exported.mismatched,
        "horizons": exported.horizons,
        "waited_for": exported.waited_for,
        "took_over_from": exported.took_over_from,
        "leftovers_removed": exported.leftovers_removed,
        "warnings": exported.warnings,
        "seconds": round(exported.seconds, 3),
        "rows_per_second": round(exported.rows_per_second),
    }


def export_text(exported: ExportResult) -> str:
    text = (
        f"export #{exported.run_id}: {exported.rows_exported:,} rows in "
        f"{exported.ranges_exported} ranges ({exported.ranges_verified} verified), "
        f"{exported.rows_per_second:,.0f} rows/s"
    )
    if exported.ids_left:
        text += f"; {exported.ids_left:,} ids left for the next run (--max-ranges)"
    if exported.took_over_from is not None:
        text += f"; took over from run #{exported.took_over_from} (marked failed)"
    if exported.leftovers_removed:
        text += f"; removed {exported.leftovers_removed} files an interrupted run left"
    if exported.mismatched:
        text += "; changed while exported, re-run: " + ", ".join(exported.mismatched)
    for warning in exported.warnings:
        text += f"\nwarning: {warning}"
    return text


def _compact(
    options: dict[str, Any], out: Writer, report: Any, alias: str | None, spark: Any
) -> int:
    from .compact import compact

    compacted = compact(
        options["destination"],
        spark=spark,
        sources=options.get("source") or ["archive", "dead"],
        target_rows=options.get("target_rows") or 1_000_000,
        retain_hours=options.get("retain_hours"),
        file_mode=options.get("file_mode") or 0o600,
        report=report,
        using=alias,
    )
    summary = {
        "run": compacted.run_id,
        "ranges_merged": compacted.ranges_merged,
        "ranges_written": compacted.ranges_written,
        "files_before": compacted.files_before,
        "files_after": compacted.files_after,
        "files_vacuumed": compacted.files_vacuumed,
        "skipped": compacted.skipped,
        "seconds": round(compacted.seconds, 3),
    }
    text = (
        f"compact #{compacted.run_id}: {compacted.ranges_merged} ranges merged into "
        f"{compacted.ranges_written}, {compacted.files_before:,} files -> "
        f"{compacted.files_after:,}, {compacted.files_vacuumed:,} old files vacuumed"
    )
    if compacted.skipped:
        text += "; skipped: " + "; ".join(compacted.skipped)
    return _emit(options, out, summary, text, 1 if compacted.skipped else 0)


def prune_text(result: Any) -> str:
    """What prune did (or, dry run, would do), in words that match what happened."""
    where = f"{result.destination}"
    if result.dry_run:
        text = (
            f"dry run, nothing deleted: would prune {result.rows:,} rows in "
            f"{result.ranges_pruned} ranges re-verified at {where}"
        )
    elif result.ranges_pruned:
        text = (
            f"pruned {result.rows:,} rows ({result.row_bytes:,} bytes of row data) in "
            f"{result.ranges_pruned} ranges re-verified at {where}; tables "
            f"{result.relation_bytes_before:,} -> {result.relation_bytes_after:,} bytes"
        )
        if not result.vacuumed:
            text += " (run with --vacuum to make the space reusable)"
    else:
        text = f"pruned nothing: no range of {where} could be deleted"
    for skipped in result.vacuum_skipped:
        text += f"\nvacuum skipped: {skipped}"
    if result.refused:
        text += f"\nrefused {len(result.refused)} ranges (rows kept): " + "; ".join(
            result.refused[:20]
        )
    if result.skipped:
        text += f"\nskipped {len(result.skipped)} changed ranges: " + "; ".join(result.skipped[:20])
    return text


def check_database(alias: str | None) -> None:
    """Connect before anything else (Spark, files): a bad DATABASE_URL is one line, at once."""
    from django.db import DatabaseError, connections

    from ..conf import get_settings

    name = alias or get_settings().DATABASE_ALIAS
    try:
        connections[name].ensure_connection()
    except DatabaseError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        settings = connections[name].settings_dict
        raise PipelineError(
            f"cannot connect to database {name!r} ({settings.get('HOST') or 'localhost'}:"
            f"{settings.get('PORT') or 5432}/{settings.get('NAME')}): {reason}"
        ) from None


def spark_conf(items: list[str], err: Writer) -> dict[str, str]:
    """``--spark-conf KEY=VALUE`` items; a secret among them gets a warning (never echoed)."""
    conf = {}
    for number, item in enumerate(items, 1):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # Not echoed: a mistyped item may be a secret value.
            raise PipelineError(f"--spark-conf takes KEY=VALUE; item {number} has no KEY=.")
        if SECRET_KEY.search(key):
            err.write(
                f"warning: --spark-conf {key} puts a secret in the process list (ps); "
                "use --spark-conf-file.\n"
            )
        conf[key.strip()] = value
    return conf


def _emit(options: dict[str, Any], out: Writer, summary: Any, text: str, status: int) -> int:
    out.write((json.dumps(summary) if options.get("json") else text) + "\n")
    return status


def main(argv: list[str] | None = None) -> int:
    """``python -m django_pgqueue.pipeline``: needs DJANGO_SETTINGS_MODULE set."""
    import django

    parser = argparse.ArgumentParser(
        prog="python -m django_pgqueue.pipeline", description="django-pgqueue data pipeline"
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    django.setup()
    return run(vars(args), sys.stdout, sys.stderr)
