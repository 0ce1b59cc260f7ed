"""Settings of the ``pgq_prune`` processes of test_retention_roles.py: tests.settings with
its retention (dead letters and the "emails" archive after a day, whole days after a week)."""

from tests.settings import *  # noqa: F403
from tests.settings import PGQUEUE

PGQUEUE = {
    **PGQUEUE,
    "ARCHIVE_RETENTION": 7 * 86400.0,
    "DEAD_RETENTION": 86400.0,
    "QUEUES": {"emails": {"ARCHIVE_RETENTION": 86400.0}},
}
