#!/usr/bin/env bash
# The package as users get it: build the sdist and the wheel, check them, install the WHEEL
# (not this checkout) in a fresh virtualenv, and use it from a new project in a temporary
# folder: migrate, enqueue messages and a task, drain them with `pgq_worker --burst`, render
# every admin page as a superuser.
#   DATABASE_URL=postgres://... bash scripts/smoke_wheel.sh
# Builds into dist/; uses the database ${PGQUEUE_TEST_DB:-test_pgqueue}_smoke (dropped after).
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$REPO_DIR/.venv/bin/python}"  # has build and twine (the dev extra)
: "${DATABASE_URL:?scripts/smoke_wheel.sh needs DATABASE_URL (bash .ci/run sets it)}"
SMOKE_DB="${PGQUEUE_TEST_DB:-test_pgqueue}_smoke"
WORK="$(mktemp -d -t pgqueue-smoke-XXXXXX)"
cleanup() {
    "$PYTHON" - "$SMOKE_DB" <<'EOF' || true
import os, sys, psycopg
with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
    conn.execute(f'DROP DATABASE IF EXISTS "{sys.argv[1]}" WITH (FORCE)')
EOF
    rm -rf "$WORK"
}
trap cleanup EXIT

echo "==> smoke: building the sdist and the wheel"
rm -rf "$REPO_DIR/dist"
"$PYTHON" -m build --outdir "$REPO_DIR/dist" "$REPO_DIR" >"$WORK/build.log" 2>&1 \
    || { cat "$WORK/build.log" >&2; exit 1; }
"$PYTHON" -m twine check --strict "$REPO_DIR"/dist/*
WHEEL="$(ls "$REPO_DIR"/dist/django_pgqueue_mq-*.whl)"

echo "==> smoke: every file of the package is in the wheel and the sdist"
"$PYTHON" - "$REPO_DIR" "$WHEEL" "$REPO_DIR"/dist/django_pgqueue_mq-*.tar.gz <<'EOF'
import subprocess, sys, tarfile, zipfile
repo, wheel, sdist = sys.argv[1:]
tracked = subprocess.run(
    ["git", "-C", repo, "ls-files", "--cached", "--others", "--exclude-standard", "django_pgqueue"], capture_output=True, text=True, check=True
).stdout.split()
in_wheel = set(zipfile.ZipFile(wheel).namelist())
in_sdist = {name.split("/", 1)[1] for name in tarfile.open(sdist).getnames() if "/" in name}
missing = [f"wheel: {p}" for p in tracked if p not in in_wheel]
missing += [f"sdist: {p}" for p in tracked if p not in in_sdist]
assert not missing, "not packaged:\n  " + "\n  ".join(missing)
kinds = sorted({p.split("/")[1] for p in tracked if p.split("/")[1] in ("templates", "static")})
print(f"    {len(tracked)} files, {', '.join(kinds)} included")
EOF

echo "==> smoke: installing the wheel in a fresh virtualenv"
"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$WHEEL[binary]" \
    2>&1 | grep -v "is ignored" || true

mkdir -p "$WORK/site/smokeapp"
cd "$WORK/site"
touch smokeapp/__init__.py
cat >smokeapp/handlers.py <<'EOF'
import django_pgqueue


@django_pgqueue.handler("smoke.echo")
def echo(payload):
    return payload


@django_pgqueue.handler("smoke.fail", max_attempts=1)
def fail(payload):
    raise ValueError("fails on purpose")
EOF
cat >smokeapp/tasks.py <<'EOF'
from django_pgqueue.tasks import task


@task
def add(a, b):
    return a + b
EOF
cat >settings.py <<'EOF'
import os
from urllib.parse import unquote, urlparse

url = urlparse(os.environ["DATABASE_URL"])
query = dict(part.split("=", 1) for part in url.query.split("&") if part)
SECRET_KEY = "smoke-test-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
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
    "smokeapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "urls"
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
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["SMOKE_DB"],
        "USER": unquote(url.username or ""),
        "PASSWORD": unquote(url.password or ""),
        "HOST": unquote(url.hostname or query.get("host", "")),
        "PORT": url.port or "",
    }
}
TASKS = {"default": {"BACKEND": "django_pgqueue.tasks.PgQueueBackend"}}
EOF
cat >urls.py <<'EOF'
from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
EOF
cat >manage.py <<'EOF'
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
from django.core.management import execute_from_command_line

execute_from_command_line(sys.argv)
EOF
cat >checks.py <<'EOF'
"""After the burst: every message done or dead, every admin page renders with our templates."""
import os
from pathlib import Path

import django

django.setup()

from django.contrib.auth.models import User
from django.contrib.staticfiles import finders
from django.test import Client
from django.test.utils import setup_test_environment
from django.urls import reverse

import django_pgqueue
from django_pgqueue.models import ArchivedMessage, DeadMessage, Message

package = Path(django_pgqueue.__file__).parent
assert "site-packages" in package.parts, f"not the installed wheel: {package}"
assert Message.objects.count() == 0, "live messages left after --burst"
# Only "django_pgqueue" is installed: none of the pipeline app's tables.
from django.db import connection

assert not [t for t in connection.introspection.table_names() if t.startswith("pgqueue_export")]
assert ArchivedMessage.objects.count() == 4, ArchivedMessage.objects.count()
dead = DeadMessage.objects.get()
assert dead.reason == "error" and "fails on purpose" in str(dead.details), dead.details

for static in sorted((package / "static").rglob("*")) if (package / "static").exists() else []:
    if static.is_file():
        relative = static.relative_to(package / "static").as_posix()
        assert finders.find(relative) == str(static), relative

setup_test_environment()
client = Client()
client.force_login(User.objects.create_superuser("smoke", "smoke@example.com", "smoke"))
pages = [reverse("admin:index"), reverse("admin:app_list", args=["django_pgqueue"])]
pages += [
    reverse(f"admin:django_pgqueue_{model}_changelist")
    for model in ("queuestate", "message", "archivedmessage", "deadmessage", "workerheartbeat")
]
pages.append(reverse("admin:django_pgqueue_deadmessage_change", args=[dead.pk]))
ours = set()
for page in pages:
    response = client.get(page)
    assert response.status_code == 200, (page, response.status_code)
    ours |= {t.name for t in response.templates if t.name and "django_pgqueue" in t.name}
assert "admin/django_pgqueue/queuestate/dashboard.html" in ours, ours
assert "admin/django_pgqueue/retry_change_form.html" in ours, ours
print(f"    {len(pages)} admin pages render; package templates used: {', '.join(sorted(ours))}")
EOF

export SMOKE_DB DJANGO_SETTINGS_MODULE=settings PYTHONPATH="$WORK/site"
PY="$WORK/venv/bin/python"
"$PYTHON" - "$SMOKE_DB" <<'EOF'
import os, sys, psycopg
with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
    conn.execute(f'DROP DATABASE IF EXISTS "{sys.argv[1]}" WITH (FORCE)')
    conn.execute(f'CREATE DATABASE "{sys.argv[1]}"')
EOF
echo "==> smoke: migrate, enqueue, pgq_worker --burst, admin pages (in $WORK/site)"
"$PY" manage.py migrate --no-input -v 0
"$PY" manage.py check --fail-level WARNING
"$PY" manage.py shell -v 0 -c '
import django_pgqueue
from smokeapp.tasks import add
for n in range(3):
    django_pgqueue.enqueue("smoke.echo", {"n": n})
django_pgqueue.enqueue("smoke.fail", {})
add.enqueue(2, 3)
'
"$PY" manage.py pgq_worker --burst -v 0
"$PY" checks.py
echo "==> smoke: passed ($(basename "$WHEEL"))"
