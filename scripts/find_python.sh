#!/usr/bin/env bash
# find_python: print the path of a Python 3.12 or newer to build .venv with; else list what
# was tried on stderr and return 1. Sourced by scripts/bootstrap.sh (and its test).
# 3.12 first: the embedded PostgreSQL (pgserver) has wheels up to 3.12. Then 3.13, then
# whatever python3 / python is, when it is new enough. Each name is tried on PATH, then in
# pyenv's versions (PYENV_ROOT, default ~/.pyenv), whose shims may exist but not run.

python_minor() {  # "13" for a working Python 3.13; nothing for another major or a broken one
    "$1" -c 'import sys; print(sys.version_info[1] if sys.version_info[0] == 3 else "")' \
        2>/dev/null
}

find_python() {
    local pyenv_root="${PYENV_ROOT:-$HOME/.pyenv}" candidates=() tried=() py path minor dir
    for minor in 12 13; do
        candidates+=("python3.$minor")
        for dir in "$pyenv_root"/versions/3."$minor".*; do
            [ -x "$dir/bin/python" ] && candidates+=("$dir/bin/python")
        done
    done
    candidates+=(python3 python)
    for py in "${candidates[@]}"; do
        path="$(command -v "$py" 2>/dev/null)" || continue
        minor="$(python_minor "$path")"
        if [[ "$minor" =~ ^[0-9]+$ ]] && [ "$minor" -ge 12 ]; then
            echo "$path"
            return 0
        fi
        tried+=("$py (${minor:+3.}${minor:-does not run})")
    done
    echo "tried: ${tried[*]:-no python3.12, python3.13, python3 or python on PATH or in $pyenv_root/versions}" >&2
    return 1
}
