#!/usr/bin/env bash
# Shared set-up for scripts/demo.sh and scripts/test.sh: a virtualenv with Python 3.12+ in
# .venv holding this checkout (editable, as django-pgqueue-mq) and its extras. Safe to run
# again: it only does what is missing.
# Usage: source scripts/bootstrap.sh [extras]   (extras default: dev)
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXTRAS="${1:-dev}"
VENV="$REPO_DIR/.venv"

source "$REPO_DIR/scripts/find_python.sh"

if [ ! -x "$VENV/bin/python" ]; then
    PYTHON="$(find_python)" || {
        cat >&2 <<'TEXT'
django-pgqueue needs Python 3.12 or newer (3.12 or 3.13 are tested). Install one, then run
this again:
    Debian/Ubuntu:  sudo apt-get install python3.12 python3.12-venv   (or python3.13 ...)
    macOS:          brew install python@3.12
    pyenv:          pyenv install 3.12
TEXT
        exit 1
    }
    echo "==> creating $VENV with $PYTHON ($("$PYTHON" --version))"
    "$PYTHON" -m venv "$VENV" || {
        rm -rf "$VENV"
        echo "could not create $VENV with $PYTHON: on Debian/Ubuntu install its venv module" \
            "(sudo apt-get install python3.$(python_minor "$PYTHON")-venv) and run this again" >&2
        exit 1
    }
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

# A stamp names the extras installed with it: one newer than pyproject.toml that holds every
# extra asked for (.installed-dev,spark serves "dev" too) leaves nothing to do.
extras_installed() {
    local stamp extra
    for stamp in "$VENV"/.installed-*; do
        [ -f "$stamp" ] && [ ! "$REPO_DIR/pyproject.toml" -nt "$stamp" ] || continue
        for extra in ${EXTRAS//,/ }; do
            [[ ",${stamp##*/.installed-}," == *",$extra,"* ]] || continue 2
        done
        return 0
    done
    return 1
}
if ! extras_installed; then
    echo "==> installing django-pgqueue-mq[$EXTRAS] and its dependencies into .venv" \
        "(pip's own output: .venv/pip.log)"
    : >"$VENV/pip.log"
    pip_install --upgrade pip
    # The distribution's name before django-pgqueue-mq: an old editable install would shadow it.
    "$VENV/bin/python" -m pip uninstall --yes --quiet django-pgqueue >>"$VENV/pip.log" 2>&1 || true
    pip_install -e "$REPO_DIR[$EXTRAS]"
    "$VENV/bin/python" -c "import django_pgqueue, django, psycopg" || { echo "install failed" >&2; exit 1; }
    touch "$VENV/.installed-$EXTRAS"
fi
export PATH="$VENV/bin:$PATH"
