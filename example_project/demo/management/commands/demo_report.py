"""Say what the worker did and where to look next."""

from typing import Any

from django.core.management.base import BaseCommand

from demo.models import Signup
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message


class Command(BaseCommand):
    help = "Print the demo's queue state and where the admin is."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(
            f"signups: {Signup.objects.count()}, welcomed: "
            f"{Signup.objects.filter(welcomed_at__isnull=False).count()}\n"
            f"messages live: {Message.objects.count()}, archived: "
            f"{ArchivedMessage.objects.count()}, dead: {DeadMessage.objects.count()}\n"
            "\nThe admin: run `cd example_project && ../.venv/bin/python manage.py runserver` "
            "and open http://127.0.0.1:8000/admin/ (user admin, password admin, or "
            "$DEMO_ADMIN_PASSWORD).\nRun a worker beside it: "
            "`../.venv/bin/python manage.py pgq_worker`."
        )
