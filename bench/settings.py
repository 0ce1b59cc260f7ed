"""Django settings for the benchmark: the bench database, persistent connections, no-op
handlers. ``BENCH_DSN`` names the database."""

import importlib.util
import os

from bench.pg import django_database

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS: list[str] = []
# The pipeline's app: the MVCC export scenario runs its `pgq_pipeline export`.
INSTALLED_APPS = ["django_pgqueue", "django_pgqueue.pipeline", "bench.benchapp"]
DATABASES = {
    "default": django_database(
        os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/pgq_bench")
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PGQUEUE = {
    "NOTIFY": True,
    "SYNCHRONOUS_ACKS": os.environ.get("BENCH_SYNC_ACKS", "0") == "1",
    # A queue of its own for the fair-backlog case (bench/mvcc_scale.py); "bench" stays plain.
    "QUEUES": {"bench_fair": {"FAIRNESS": True}},
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}

# The django.tasks backend, when this version of django-pgqueue has it.
if importlib.util.find_spec("django_pgqueue.tasks") is not None:
    TASKS = {"default": {"BACKEND": "django_pgqueue.tasks.PgQueueBackend", "QUEUES": []}}
