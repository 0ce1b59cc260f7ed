"""The admin: a queue dashboard, read-only message browsers and permissioned actions.

Importing this package (Django's admin autodiscovery does) registers the model admins on
the default admin site.
"""

from .browsers import ArchivedMessageAdmin, DeadMessageAdmin, MessageAdmin, WorkerHeartbeatAdmin
from .dashboard import QueueStateAdmin
from .periodic import PeriodicScheduleAdmin

__all__ = [
    "ArchivedMessageAdmin",
    "DeadMessageAdmin",
    "MessageAdmin",
    "PeriodicScheduleAdmin",
    "QueueStateAdmin",
    "WorkerHeartbeatAdmin",
]
