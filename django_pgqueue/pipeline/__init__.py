"""The data pipeline on Spark: export the archive to Delta Lake tables, hourly stats, verified
pruning and bulk enqueue.

Importing this package needs neither pyspark nor Java; the jobs import pyspark when they
start a session (``pip install 'django-pgqueue-mq[spark]'``). An export is read with any
Delta Lake reader (docs/how-to/pipeline.md).
"""
