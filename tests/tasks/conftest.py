"""The Tasks backend tests need a Tasks framework: ``django.tasks`` (Django 6.0+) or the
``django-tasks`` backport on Django 5.2. Without one they are not collected (the session
header says so); ``tests/unit/test_compat.py`` checks what happens then."""

from django_pgqueue.compat import TASKS_FRAMEWORK

if TASKS_FRAMEWORK is None:
    collect_ignore_glob = ["test_*.py"]
