#!/usr/bin/env bash
# Runs the whole test suite. Sets itself up: virtualenv, dependencies, a PostgreSQL.
#   DATABASE_URL set   -> tests use that server (the test database is created and dropped)
#   DATABASE_URL unset -> an embedded PostgreSQL is started in .pgdata/ (Python 3.13: the
#                         machine's PostgreSQL, see scripts/find_database.sh)
#   PGQUEUE_TEST_DB    -> the test database's name (default test_pgqueue); give each checkout
#                         its own when several run their suites against one server
# System packages (Java and the JDBC driver for the Spark tests, Chromium for the admin browser
# tests) are installed only when asked: --install-system-deps, or yes at the prompt.
# Other arguments go to pytest, e.g.  bash scripts/test.sh -m "not slow"
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
install_system_deps=no
if [ "${1:-}" = "--install-system-deps" ]; then
    install_system_deps=yes
    shift
fi
source scripts/bootstrap.sh "dev,spark"
source scripts/find_database.sh

if ! missing="$(bash scripts/system-deps.sh --check)"; then
    echo "==> system packages some tests need are missing:"
    echo "$missing"
    if [ "$install_system_deps" = no ] && [ -t 0 ]; then
        read -r -p "    install them now with apt-get (needs root or sudo)? [y/N] " answer
        [[ "$answer" =~ ^[Yy] ]] && install_system_deps=yes
    fi
    if [ "$install_system_deps" = yes ]; then
        bash scripts/system-deps.sh
    else
        echo "    not installed: Spark tests will be skipped and browser tests will fail."
        echo "    Install them with: bash scripts/test.sh --install-system-deps"
        echo "    or leave those tests out: bash scripts/test.sh -m \"not spark and not browser\""
    fi
fi

set +e
python -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure." >&2
    exit 1
fi
exit "$status"
