#!/usr/bin/env bash
# Shared set-up for scripts/demo.sh and scripts/test.sh: a virtualenv with Python 3.12+ in
# .venv holding django-pgqueue and its extras. Safe to run again: it only does what is missing.
# Usage: source scripts/bootstrap.sh [extras]   (extras default: dev)
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXTRAS="${1:-dev}"
VENV="$REPO_DIR/.venv"

find_python() {
    # 3.12 first: the embedded PostgreSQL wheel (pgserver) is published up to 3.12.
    local candidates=(python3.12)
    for dir in "$HOME"/.pyenv/versions/3.12* /root/.pyenv/versions/3.12* "$HOME"/.pyenv/versions/3.13* /root/.pyenv/versions/3.13*; do
        [ -x "$dir/bin/python" ] && candidates+=("$dir/bin/python")
    done
    for py in "${candidates[@]}"; do
        if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
            command -v "$py"
            return 0
        fi
    done
    return 1
}

if [ ! -x "$VENV/bin/python" ]; then
    PYTHON="$(find_python)" || {
        echo "django-pgqueue needs Python 3.12 or newer (python3.12 / python3.13 not found)." >&2
        exit 1
    }
    echo "==> creating $VENV with $PYTHON ($("$PYTHON" --version))"
    "$PYTHON" -m venv "$VENV"
fi

STAMP="$VENV/.installed-$EXTRAS"
if [ ! -f "$STAMP" ] || [ "$REPO_DIR/pyproject.toml" -nt "$STAMP" ]; then
    echo "==> installing django-pgqueue[$EXTRAS] into .venv"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip 2>&1 | grep -v "is ignored" || true
    "$VENV/bin/python" -m pip install --quiet -e "$REPO_DIR[$EXTRAS]" 2>&1 | grep -v "is ignored" || true
    "$VENV/bin/python" -c "import django_pgqueue, django, psycopg" || { echo "install failed" >&2; exit 1; }
    touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
