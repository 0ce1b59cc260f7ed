"""Create an admin login and post sample signups through the demo view (as a browser would)."""

import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.test import Client

import django_pgqueue


class Command(BaseCommand):
    help = "Create the demo admin user and enqueue sample messages through the signup view."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--signups", type=int, default=20)

    def handle(self, *args: Any, signups: int, **options: Any) -> None:
        password = os.environ.get("DEMO_ADMIN_PASSWORD", "admin")
        user_model = get_user_model()
        if not user_model.objects.filter(username="admin").exists():
            user_model.objects.create_superuser("admin", "admin@example.com", password)
            self.stdout.write("created superuser admin / " + password)
        client = Client(SERVER_NAME="localhost")
        for n in range(signups):
            response = client.post("/signup/", {"email": f"user{n}@example.com"})
            if response.status_code != 201:
                raise RuntimeError(f"signup view answered {response.status_code}")
        self.stdout.write(f"posted {signups} signups; each enqueued a welcome message on commit")
        django_pgqueue.enqueue("demo.sync-crm", {"signup_id": 1})
        self.stdout.write("enqueued a demo.sync-crm message that fails: the dead letters show it")
        response = client.post("/tasks/digest/", {"note": "demo_setup"})
        if response.status_code != 201:
            raise RuntimeError(f"digest view answered {response.status_code}")
        task_id = response.json()["task_id"]
        self.stdout.write(
            f"enqueued the signup_digest django.tasks task {task_id}; "
            f"its status is at /tasks/{task_id}/"
        )
