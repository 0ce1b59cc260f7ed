#!/usr/bin/env bash
# The main job: set up, migrate, enqueue sample messages through the demo views (one of them
# fails for good, so the dead letters have something to show), run the worker until they are
# done, then show the admin.
#   bash scripts/demo.sh           ... and print the command that serves the admin
#   bash scripts/demo.sh --serve   ... and serve it at http://127.0.0.1:8000/admin/ with a
#                                  worker beside it (Ctrl-C stops both)
#   bash scripts/demo.sh --stop    stop the embedded PostgreSQL
# DATABASE_URL set -> that server; unset -> an embedded PostgreSQL keeping its data in .pgdata/,
# which keeps running for the next command until --stop (Python 3.13: the machine's
# PostgreSQL, see scripts/find_database.sh).
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
mode="${1:-}"
case "$mode" in
    "" | --serve) ;;
    --stop)
        if [ -x .venv/bin/python ]; then
            .venv/bin/python -m django_pgqueue.embedded stop .pgdata
        else
            echo "none was running (no .venv yet)"
        fi
        exit 0
        ;;
    *)
        echo "usage: bash scripts/demo.sh [--serve | --stop]" >&2
        exit 2
        ;;
esac
# What the example site needs, not the test and lint tools: a first run installs little.
source scripts/bootstrap.sh "binary,embedded,example"
source scripts/find_database.sh

# The example site has DEBUG off and no SECRET_KEY unless told: the demo tells it, and the
# commands it prints carry the same values, so they work in a new shell.
export DEBUG="${DEBUG:-1}"
if [ -z "${SECRET_KEY:-}" ]; then
    SECRET_KEY="demo-only-$(python -c 'import secrets; print(secrets.token_urlsafe(32))')"
    export SECRET_KEY
fi
if [ -n "${DATABASE_URL:-}" ]; then
    echo "==> database: $DATABASE_URL"
else
    echo "==> database: an embedded PostgreSQL in .pgdata/ (started on first use)"
fi

cd example_project
python manage.py migrate --no-input -v 0
python manage.py demo_setup
python manage.py pgq_worker --burst --concurrency 4
python manage.py demo_report

env_words="DEBUG=$DEBUG SECRET_KEY=$SECRET_KEY"
[ -n "${DATABASE_URL:-}" ] && env_words="DATABASE_URL=$DATABASE_URL $env_words"
if [ "$mode" = "--serve" ]; then
    echo "==> serving the admin at http://127.0.0.1:8000/admin/ (user admin, password" \
        "${DEMO_ADMIN_PASSWORD:-admin}) with a worker beside it; Ctrl-C stops both"
    python manage.py pgq_worker --concurrency 2 &
    worker=$!
    trap 'kill -TERM "$worker" 2>/dev/null; wait "$worker" 2>/dev/null' EXIT
    python manage.py runserver --noreload 127.0.0.1:8000
    exit 0
fi
cat <<TEXT

The admin (user admin, password ${DEMO_ADMIN_PASSWORD:-admin}): bash scripts/demo.sh --serve
or, in any shell:
    cd $REPO_DIR/example_project && $env_words ../.venv/bin/python manage.py runserver
and open http://127.0.0.1:8000/admin/. A worker beside it (another shell):
    cd $REPO_DIR/example_project && $env_words ../.venv/bin/python manage.py pgq_worker
TEXT
if [ -z "${DATABASE_URL:-}" ]; then
    echo "The embedded PostgreSQL keeps running for those; stop it with: bash scripts/demo.sh --stop"
fi
