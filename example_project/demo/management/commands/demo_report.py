"""Say what the worker did."""

from typing import Any

from django.core.management.base import BaseCommand

from demo.models import Signup
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message


class Command(BaseCommand):
    help = "Print the demo's queue state."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(
            f"signups: {Signup.objects.count()}, welcomed: "
            f"{Signup.objects.filter(welcomed_at__isnull=False).count()}\n"
            f"messages live: {Message.objects.count()}, archived: "
            f"{ArchivedMessage.objects.count()}, dead: {DeadMessage.objects.count()} "
            "(the admin's Dead messages page retries them)"
        )
