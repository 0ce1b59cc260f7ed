#!/usr/bin/env bash
# The benchmark, on one command: sets up what it needs, runs every scenario against one
# PostgreSQL, prints the markdown tables and writes PNG plots. See docs/benchmarks.md.
#
#   bash bench/run.sh [--quick] [--only enqueue,drain,claim,producers,latency,steady,memory]
#                     [--reps N] [--no-peers | --peers pgqueuer,procrastinate,tasksdb,celery]
#                     [--setup-only]
#
# BENCH_SERVER_DSN (default postgresql://postgres@127.0.0.1:5432/postgres) is the server; the
# run creates and drops its own database (pgq_bench). Celery needs Redis on 127.0.0.1:6379
# (BENCH_REDIS_URL). Peer virtualenvs live in bench/.venvs/ (git-ignored).
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
source scripts/bootstrap.sh "dev"
VENVS="$REPO_DIR/bench/.venvs"
BASE_PYTHON="$("$REPO_DIR/.venv/bin/python" -c 'import sys, os; print(os.path.join(sys.base_prefix, "bin", "python3"))')"

# name, then pip requirements. A stamp file makes a second run skip the install.
make_venv() {
    local name="$1"; shift
    local venv="$VENVS/$name"
    local stamp="$venv/.installed"
    local want="$*"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    echo "==> bench venv $name: $want"
    [ -x "$venv/bin/python" ] || "$BASE_PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
        | grep -v "is ignored" || true
    echo "$want" > "$stamp"
}

SETUP_ONLY=0
ARGS=()
for arg in "$@"; do
    if [ "$arg" = "--setup-only" ]; then SETUP_ONLY=1; else ARGS+=("$arg"); fi
done

mkdir -p "$VENVS"
make_venv plots "matplotlib>=3.8"
make_venv pgqueuer "pgqueuer>=0.20" "asyncpg>=0.29" "psycopg[binary]>=3.2"
make_venv procrastinate "procrastinate>=3" "psycopg[binary,pool]>=3.2"
make_venv tasksdb "django>=6.1,<6.2" "django-tasks-db" "psycopg[binary]>=3.2"
make_venv celery "celery[redis]>=5.4" "psycopg[binary]>=3.2"
[ "$SETUP_ONLY" = 1 ] && exit 0

exec "$REPO_DIR/.venv/bin/python" -m bench "${ARGS[@]}"
