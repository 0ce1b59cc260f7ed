"""Settings of the worker processes in test_periodic_workers.py: tests.settings plus an app
that declares a periodic schedule."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.acceptance.periodicapp.apps.PeriodicAppConfig"]
