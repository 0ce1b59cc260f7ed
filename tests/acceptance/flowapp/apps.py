import os

from django.apps import AppConfig


class FlowAppConfig(AppConfig):
    name = "tests.acceptance.flowapp"
    label = "flowapp"

    def ready(self) -> None:
        # A seam for the claim-credit test: a small optimistic margin (2 claims of 4 at once),
        # so that credits are granted with limits small enough for a few workers to reach.
        if os.environ.get("PGQ_FLOW_SMALL_MARGIN"):
            from django_pgqueue.core import flow_control

            flow_control.OPTIMISTIC_CLAIMS = 2
            flow_control.OPTIMISTIC_BATCH = 4
