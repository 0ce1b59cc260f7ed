#!/usr/bin/env bash
# Shared set-up for scripts/demo.sh and scripts/test.sh: a virtualenv with Python 3.12+ in
# .venv holding this checkout (editable, as django-pgqueue-mq) and its extras. Safe to run
# again: it only does what is missing.
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

# pip's own output goes to .venv/pip.log; the terminal gets one line per package, so a long
# first install shows progress without pip's warnings. A failed install prints the log's end.
pip_install() {
    local log="$VENV/pip.log" status
    set +e
    "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off "$@" \
        2>>"$log" | tee -a "$log" \
        | grep --line-buffered -E '^(Collecting|Installing collected packages)' \
        | sed -u -E 's/^Collecting ([^ ]+).*/    collecting \1/; s/^Installing collected.*/    installing.../'
    status=${PIPESTATUS[0]}
    set -e
    if [ "$status" -ne 0 ]; then
        echo "pip install failed; the end of $log:" >&2
        tail -n 25 "$log" >&2
        exit 1
    fi
}

STAMP="$VENV/.installed-$EXTRAS"
if [ ! -f "$STAMP" ] || [ "$REPO_DIR/pyproject.toml" -nt "$STAMP" ]; then
    echo "==> installing django-pgqueue-mq[$EXTRAS] and its dependencies into .venv" \
        "(pip's own output: .venv/pip.log)"
    : >"$VENV/pip.log"
    pip_install --upgrade pip
    # The distribution's name before django-pgqueue-mq: an old editable install would shadow it.
    "$VENV/bin/python" -m pip uninstall --yes --quiet django-pgqueue >>"$VENV/pip.log" 2>&1 || true
    pip_install -e "$REPO_DIR[$EXTRAS]"
    "$VENV/bin/python" -c "import django_pgqueue, django, psycopg" || { echo "install failed" >&2; exit 1; }
    touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
