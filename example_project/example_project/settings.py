"""Settings of the example site, read from the environment or a ``.env`` file (django-environ).

``DATABASE_URL`` unset -> an embedded PostgreSQL keeps its data in ``<repo>/.pgdata``.
``DEBUG`` is off and there is no ``SECRET_KEY`` unless you set them (``scripts/demo.sh`` sets
both for its own commands and prints them): Django then refuses to sign sessions rather than
use a key that is in the repository.
"""

from pathlib import Path

import environ

from django_pgqueue.embedded import database_from_environment

BASE_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = BASE_DIR.parent

env = environ.Env(DEBUG=(bool, False))
environ.Env.read_env(REPO_DIR / ".env")
environ.Env.read_env(BASE_DIR / ".env")

# Empty: commands that sign nothing (migrate, pgq_worker) run; requests that need it fail loudly.
SECRET_KEY = env("SECRET_KEY", default="")
DEBUG = env("DEBUG")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_pgqueue",
    "django_pgqueue.pipeline",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "example_project.wsgi.application"

DATABASES = {"default": database_from_environment(REPO_DIR / ".pgdata")}
# Workers and web processes keep their connection: reconnecting per request costs ~2.7x.
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

PGQUEUE = {
    "QUEUES": {"emails": {"MAX_ATTEMPTS": 5}},
}

# django.tasks on the same tables and worker (demo/tasks.py); see docs/how-to/django-tasks.md.
TASKS = {
    "default": {
        "BACKEND": "django_pgqueue.tasks.PgQueueBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"max_attempts": env.int("TASKS_MAX_ATTEMPTS", default=3)},
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_pgqueue": {"handlers": ["console"], "level": "INFO"},
        "demo": {"handlers": ["console"], "level": "INFO"},
    },
}
