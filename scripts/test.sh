#!/usr/bin/env bash
# Runs the whole test suite. Sets itself up: virtualenv, dependencies, a PostgreSQL.
#   DATABASE_URL set   -> tests use that server (the test database is created and dropped)
#   DATABASE_URL unset -> an embedded PostgreSQL is started in .pgdata/
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -m "not slow"
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
source scripts/bootstrap.sh "dev,spark"
bash scripts/system-deps.sh
set +e
python -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure." >&2
    exit 1
fi
exit "$status"
