"""Settings of the worker processes of test_supervision.py: tests.settings plus the app
that injects faults and returns what ``jsonb`` cannot store (``faultapp``)."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.worker.faultapp.apps.FaultAppConfig"]
