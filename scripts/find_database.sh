#!/usr/bin/env bash
# Sourced by scripts/demo.sh and scripts/test.sh after scripts/bootstrap.sh: with DATABASE_URL
# unset, the embedded PostgreSQL (pgserver) serves .pgdata/. Where pgserver has no wheel
# (Python 3.13), a PostgreSQL this machine runs is used when it lets us in (its URL is
# exported and printed); else one is started from the machine's binaries in .pgdata/; else
# this says exactly what to do, and stops.
if [ -z "${DATABASE_URL:-}" ] && ! python -c 'import pgserver' >/dev/null 2>&1; then
    if local_url="$(python -m django_pgqueue.embedded local)"; then
        export DATABASE_URL="$local_url"
        echo "==> no embedded PostgreSQL for $(python --version); using the server this" \
            "machine runs: DATABASE_URL=$DATABASE_URL"
    else
        python -m django_pgqueue.embedded url "$REPO_DIR/.pgdata" >/dev/null || exit 1
    fi
fi
