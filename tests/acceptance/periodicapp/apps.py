from django.apps import AppConfig


class PeriodicAppConfig(AppConfig):
    name = "tests.acceptance.periodicapp"
    label = "periodicapp"
