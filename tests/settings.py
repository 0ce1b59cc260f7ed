"""Settings for the test suite: a real PostgreSQL, never SQLite.

``DATABASE_URL`` set -> that server; unset -> the embedded server in ``<repo>/.pgdata``.
``PGQUEUE_TEST_DB`` names the test database (default ``test_pgqueue``) so that several
checkouts can run their suites against one server at once.
"""

import os
from pathlib import Path

from django_pgqueue.compat import TASKS_FRAMEWORK
from django_pgqueue.embedded import database_from_environment

REPO_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_pgqueue",
    "django_pgqueue.pipeline",
    "tests.testapp",
]
# The apps that define tasks need a Tasks framework: without one (Django 5.2 without the
# django-tasks backport) the queue, the worker and the admin are tested alone.
if TASKS_FRAMEWORK is not None:
    INSTALLED_APPS += ["demo", "tests.taskapp"]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "example_project.urls" if TASKS_FRAMEWORK is not None else "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "static/"

DATABASES = {"default": database_from_environment(REPO_DIR / ".pgdata")}
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("PGQUEUE_TEST_DB", "test_pgqueue")}
# The same test database through psycopg's server-side binding (one statement per query).
DATABASES["server_side_binding"] = {
    **DATABASES["default"],
    "OPTIONS": {**DATABASES["default"].get("OPTIONS", {}), "server_side_binding": True},
    "TEST": {"MIRROR": "default"},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

PGQUEUE = {"BACKOFF_JITTER": 0.0}

# The django.tasks backend under test (tests/tasks/); "dummy" stores without running.
TASKS = {
    "default": {
        "BACKEND": "django_pgqueue.tasks.PgQueueBackend",
        "QUEUES": ["default", "tasks-other", "emails"],
    },
    "dummy": {"BACKEND": "django_pgqueue.tasks.PgQueueDummyBackend", "QUEUES": []},
    "immediate": {"BACKEND": "django_pgqueue.tasks.PgQueueImmediateBackend"},
}
