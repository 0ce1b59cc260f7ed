"""Staff users with exactly the permissions a test names, logged in through Django's client."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

VIEW_PERMISSIONS = [
    "view_message",
    "view_archivedmessage",
    "view_deadmessage",
    "view_queuestate",
    "view_workerheartbeat",
]

StaffClient = Callable[..., Client]


def make_staff(username: str, *codenames: str, superuser: bool = False) -> User:
    user = User.objects.create_user(username, is_staff=True)  # force_login: no slow hashing
    if superuser:
        user.is_superuser = True
        user.save()
    perms = Permission.objects.filter(
        content_type__app_label__in=["django_pgqueue", "django_pgqueue_pipeline"],
        codename__in=codenames,
    )
    assert perms.count() == len(set(codenames)), f"unknown permission among {codenames}"
    user.user_permissions.add(*perms)
    return user


@pytest.fixture
def staff_client(db: None) -> StaffClient:
    """``staff_client("retry_deadmessage")``: a client logged in as staff with view
    permissions plus the ones named; ``staff_client(superuser=True)`` for a superuser."""
    counter = iter(range(1000))

    def build(*codenames: str, superuser: bool = False, view: bool = True) -> Client:
        perms = [*VIEW_PERMISSIONS, *codenames] if view else list(codenames)
        user = make_staff(f"staff{next(counter)}", *perms, superuser=superuser)
        client = Client()
        client.force_login(user)
        return client

    return build
