"""A project with only the queue app, plus the pipeline app when PGQUEUE_WITH_PIPELINE=1
(``test_app.py`` migrates it in a database of its own, named by ``DATABASE_URL``)."""

import os

from django_pgqueue.embedded import database_from_environment

SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_pgqueue"]
if os.environ.get("PGQUEUE_WITH_PIPELINE") == "1":
    INSTALLED_APPS.append("django_pgqueue.pipeline")
DATABASES = {"default": database_from_environment("/nonexistent")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
