"""The data pipeline on Spark: export the archive to Parquet, hourly stats, verified pruning
and bulk enqueue.

Importing this package needs neither pyspark nor Java; the jobs import pyspark when they
start a session (``pip install 'django-pgqueue-mq[spark]'``).
"""

# Readers of an export's committed files: no Django, no Spark needed to import them.
from .committed import read_committed, read_committed_arrow, read_committed_spark

__all__ = ["read_committed", "read_committed_arrow", "read_committed_spark"]
