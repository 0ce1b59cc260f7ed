from django.apps import AppConfig


class PipelineConfig(AppConfig):
    """The Spark pipeline as an app of its own: its tables, admin pages and ``pgq_pipeline``
    come with ``"django_pgqueue.pipeline"`` in ``INSTALLED_APPS``, next to ``"django_pgqueue"``."""

    name = "django_pgqueue.pipeline"
    label = "django_pgqueue_pipeline"
    verbose_name = "Queue pipeline"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The pipeline's rule for retention: never expire what a configured export destination
        # does not hold yet (inert unless PGQUEUE_PIPELINE names one).
        from . import retention_guard

        retention_guard.install()
