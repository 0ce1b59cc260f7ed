"""The demo's handlers: what a worker runs for the messages the views enqueue."""

import logging

from django.utils import timezone

import django_pgqueue

from .models import Signup

logger = logging.getLogger("demo")


@django_pgqueue.handler("demo.send-welcome", queue="emails")
def send_welcome(payload: dict) -> dict:
    # Idempotent: a redelivered message finds the signup already welcomed and does nothing.
    updated = Signup.objects.filter(pk=payload["signup_id"], welcomed_at__isnull=True).update(
        welcomed_at=timezone.now()
    )
    logger.info(
        "welcome e-mail for signup %s (%s)",
        payload["signup_id"],
        "sent" if updated else "already sent",
    )
    return {"sent": bool(updated)}


@django_pgqueue.handler("demo.sync-crm", max_attempts=1)
def sync_crm(payload: dict) -> None:
    # The demo's CRM does not exist: the message fails on its only attempt and lands in the
    # dead letters, where the admin's Retry and Requeue actions can be tried on it.
    raise ConnectionError(f"crm.invalid refused the connection for signup {payload['signup_id']}")
