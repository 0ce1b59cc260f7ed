from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class PgQueueConfig(AppConfig):
    name = "django_pgqueue"
    label = "django_pgqueue"
    verbose_name = "PostgreSQL queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks, and the Tasks framework's own TASKS checks (when there
        # is a framework), which otherwise run only if something else imports it.
        from . import checks  # noqa: F401
        from .compat import import_tasks_framework_checks

        import_tasks_framework_checks()

        # Every process (web and worker alike) imports each app's ``handlers`` module, as the
        # admin does with ``admin.py``: enqueue() then applies a handler's defaults (queue,
        # max_attempts) the same way wherever it is called.
        autodiscover_modules("handlers")
