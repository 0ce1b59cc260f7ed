#!/usr/bin/env bash
# The main job: set up, migrate, enqueue sample messages through the demo view, run the
# worker until they are done, and say where the admin is.
#   DATABASE_URL set   -> that server;  unset -> an embedded PostgreSQL in .pgdata/
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
source scripts/bootstrap.sh "dev"
cd example_project
python manage.py migrate --no-input -v 0
python manage.py demo_setup
python manage.py pgq_worker --burst --concurrency 4
python manage.py demo_report
