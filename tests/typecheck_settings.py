"""Minimal settings for mypy's Django plugin: no database is contacted, no server started."""

SECRET_KEY = "typecheck"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_pgqueue",
    "django_pgqueue.pipeline",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "typecheck"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
