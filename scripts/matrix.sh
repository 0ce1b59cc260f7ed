#!/usr/bin/env bash
# The supported versions besides the default .venv (Django 6.1, Python 3.12, whole suite):
# each entry gets a virtualenv in .venv-matrix/<name> and runs the core, composition, worker, tasks and
# admin tests (plus tests/unit). Safe to run again: a virtualenv is only rebuilt when
# pyproject.toml changed.
#   bash scripts/matrix.sh                 every entry
#   bash scripts/matrix.sh dj52-py312 ...  the named entries
#   bash scripts/matrix.sh --setup-only    only build the virtualenvs (and of the named entries)
# Needs DATABASE_URL (the machine's server, or the embedded one .ci/run starts); each entry
# uses its own test database, ${PGQUEUE_TEST_DB:-test_pgqueue}_<name>.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"

# name  python  django  extras  tests   (dj52-py313 has no django-tasks backport: the queue,
# worker and admin need nothing else on 5.2, and the tasks tests are not collected). "all"
# runs the slow tests (worker processes) too; "fast" leaves them to the entries that differ
# most from the default (the oldest Django with each Python) and to the suite. No entry runs
# the scale tests (big tables: what PostgreSQL plans and reads, the same on every version).
MATRIX=(
    "dj52-py312 3.12 django~=5.2.19 test,tasks all"
    "dj52-py313 3.13 django~=5.2.19 test all"
    "dj60-py312 3.12 django~=6.0.10 test fast"
    "dj60-py313 3.13 django~=6.0.10 test fast"
    "dj61-py313 3.13 django~=6.1.3 test fast"
)
TESTS=(tests/unit tests/core tests/composition tests/worker tests/tasks tests/admin)

setup_only=no
if [ "${1:-}" = "--setup-only" ]; then
    setup_only=yes
    shift
fi
if [ -z "${DATABASE_URL:-}" ] && [ "$setup_only" = no ]; then
    echo "scripts/matrix.sh needs DATABASE_URL (bash .ci/run sets it)." >&2
    exit 1
fi

find_python() {  # find_python 3.13 -> a python3.13 executable
    local version="$1" candidate
    for candidate in "python$version" "$HOME"/.pyenv/versions/"$version"*/bin/python \
        /root/.pyenv/versions/"$version"*/bin/python; do
        if command -v "$candidate" >/dev/null 2>&1 \
            && "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$version'.split('.'))))" 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

setup_entry() {  # setup_entry name python django extras
    local name="$1" version="$2" django="$3" extras="$4"
    local venv="$REPO_DIR/.venv-matrix/$name" python
    python="$(find_python "$version")" || {
        echo "==> $name: Python $version not found" >&2
        return 1
    }
    if [ ! -f "$venv/.installed" ] || [ "$REPO_DIR/pyproject.toml" -nt "$venv/.installed" ]; then
        echo "==> $name: creating .venv-matrix/$name ($("$python" --version), $django, [$extras])"
        rm -rf "$venv"
        "$python" -m venv "$venv"
        # pip's output (and the build backend's warnings) go to the entry's pip.log.
        if ! { "$venv/bin/python" -m pip install --disable-pip-version-check --upgrade pip \
            && "$venv/bin/python" -m pip install --disable-pip-version-check \
                "$django" -e "$REPO_DIR[$extras]"; } >"$venv/pip.log" 2>&1; then
            echo "==> $name: pip install failed; the end of .venv-matrix/$name/pip.log:" >&2
            tail -n 25 "$venv/pip.log" >&2
            return 1
        fi
        touch "$venv/.installed"
    fi
}

run_entry() {  # run_entry name python django extras tests
    local name="$1" version="$2" django="$3" extras="$4" which="$5"
    local markers="not spark and not browser and not scale"
    [ "$which" = all ] || markers="$markers and not slow"
    local venv="$REPO_DIR/.venv-matrix/$name"
    setup_entry "$name" "$version" "$django" "$extras" || return 1
    local django_version log="$venv/last-run.log" started=$SECONDS status=0
    django_version="$("$venv/bin/python" -c 'import django; print(django.__version__)')"
    echo "==> $name: $("$venv/bin/python" --version), Django $django_version"
    # pytest's pythonpath puts the repository first: the tests run this checkout's code.
    PGQUEUE_TEST_DB="${PGQUEUE_TEST_DB:-test_pgqueue}_${name//-/_}" \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "$markers" \
        "${TESTS[@]}" >"$log" 2>&1 || status=$?
    tail -n 12 "$log"
    SUMMARY+=("$name (Django $django_version): $(tail -n 1 "$log" | tr -d '=') [$((SECONDS - started))s]")
    return "$status"
}

SUMMARY=()
failed=()
for entry in "${MATRIX[@]}"; do
    read -r name version django extras which <<<"$entry"
    if [ $# -gt 0 ] && [[ ! " $* " == *" $name "* ]]; then
        continue
    fi
    if [ "$setup_only" = yes ]; then
        setup_entry "$name" "$version" "$django" "$extras" || failed+=("$name")
    else
        run_entry "$name" "$version" "$django" "$extras" "$which" || failed+=("$name")
    fi
done
if [ "$setup_only" = yes ]; then
    if [ ${#failed[@]} -gt 0 ]; then
        echo "matrix virtualenvs not built: ${failed[*]}" >&2
        exit 1
    fi
    exit 0
fi
echo "==> matrix"
printf '    %s\n' "${SUMMARY[@]}"
if [ ${#failed[@]} -gt 0 ]; then
    echo "matrix entries failed: ${failed[*]}" >&2
    exit 1
fi
