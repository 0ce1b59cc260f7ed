"""The admin: a queue dashboard, read-only message browsers and permissioned actions.

Importing this package (Django's admin autodiscovery does) registers the model admins on
the default admin site.
"""

from .batches import BatchAdmin
from .browsers import ArchivedMessageAdmin, DeadMessageAdmin, MessageAdmin, WorkerHeartbeatAdmin
from .dashboard import QueueStateAdmin
from .periodic import PeriodicScheduleAdmin
from .waiting import WaitingMessageAdmin

__all__ = [
    "ArchivedMessageAdmin",
    "BatchAdmin",
    "DeadMessageAdmin",
    "MessageAdmin",
    "PeriodicScheduleAdmin",
    "QueueStateAdmin",
    "WaitingMessageAdmin",
    "WorkerHeartbeatAdmin",
]
