"""Settings of the worker processes of test_retention_worker.py: tests.settings with retention
every half second and a week of archive."""

from tests.settings import *  # noqa: F403
from tests.settings import PGQUEUE

PGQUEUE = {**PGQUEUE, "RETENTION_INTERVAL": 0.5, "ARCHIVE_RETENTION": 7 * 86400.0}
