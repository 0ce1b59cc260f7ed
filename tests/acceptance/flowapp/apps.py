from django.apps import AppConfig


class FlowAppConfig(AppConfig):
    name = "tests.acceptance.flowapp"
    label = "flowapp"
