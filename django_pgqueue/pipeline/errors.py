"""What the pipeline raises when it cannot do the job; the command prints the message as is."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from ..exceptions import PgQueueError


class PipelineError(PgQueueError):
    """A pipeline job refused or failed for a reason an operator can act on."""


class SparkUnavailable(PipelineError, ImproperlyConfigured):
    """pyspark, Java or the PostgreSQL JDBC driver is missing."""


class MasterUnreachable(PipelineError):
    """The Spark master URL given does not answer."""


class ForeignOutput(PipelineError):
    """The export destination holds files this pipeline did not write."""


class DestinationBusy(PipelineError):
    """Another export run holds the destination's lease."""


class LeaseLost(PipelineError):
    """This run's lease on its destination expired or was taken over; it stops committing."""


class BadManifest(PipelineError, ValueError):
    """A file under the export's ``_committed/`` is not a manifest the exporter could have
    written; nothing it lists is read or deleted."""


class NotPrunable(PipelineError):
    """Prune refused: what it would delete is not (or no longer) verifiably exported."""


class NoVerifiedExport(PipelineError):
    """Prune was asked to delete rows that no completed export verified."""


class BadInput(PipelineError):
    """Bulk-enqueue input rows failed validation; ``bad_rows`` lists (row number, reason)."""

    def __init__(self, message: str, bad_rows: list[tuple[int, str]], bad_count: int) -> None:
        super().__init__(message)
        self.bad_rows = bad_rows
        self.bad_count = bad_count
