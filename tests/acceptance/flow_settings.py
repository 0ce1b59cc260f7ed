"""Settings of the worker processes in test_flow_control.py: tests.settings plus the
flow-controlled queues and the handler app that records in-flight counts."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, PGQUEUE

INSTALLED_APPS = [*INSTALLED_APPS, "tests.acceptance.flowapp.apps.FlowAppConfig"]

PGQUEUE = {
    **PGQUEUE,
    "QUEUES": {
        **PGQUEUE.get("QUEUES", {}),
        "flow-limited": {"CONCURRENCY_LIMIT": 3},
        "flow-keyed": {"KEY_CONCURRENCY_LIMIT": 1},
        "flow-crash": {"KEY_CONCURRENCY_LIMIT": 1, "VISIBILITY_TIMEOUT": 2},
        "flow-fair": {"FAIRNESS": True},
        "flow-rate": {"RATE_LIMIT": 20},
        "flow-paused": {"CONCURRENCY_LIMIT": 10},
        # Exact claims far from these limits reserve allowances.
        "flow-allowances": {
            "FAIRNESS": True,
            "CONCURRENCY_LIMIT": 40,
            "KEY_CONCURRENCY_LIMIT": 30,
            "RATE_LIMIT": 10_000,
        },
    },
}
