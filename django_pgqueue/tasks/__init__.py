"""django-pgqueue as a ``django.tasks`` backend.

```python
TASKS = {"default": {"BACKEND": "django_pgqueue.tasks.PgQueueBackend"}}
```

Tasks are messages: they live in the same live / archive / dead tables and run in the same
``pgq_worker`` as plain messages. See ``docs/how-to/django-tasks.md``.
"""

from ..exceptions import LeaseExpired, TaskRejected, TaskTimeout
from .backend import (
    InvalidTaskMessage,
    PgQueueBackend,
    PgQueueDummyBackend,
    PgQueueImmediateBackend,
)
from .commit import enqueue_on_commit
from .task import PgQueueTask, task

__all__ = [
    "InvalidTaskMessage",
    "LeaseExpired",
    "PgQueueBackend",
    "PgQueueDummyBackend",
    "PgQueueImmediateBackend",
    "PgQueueTask",
    "TaskRejected",
    "TaskTimeout",
    "enqueue_on_commit",
    "task",
]
