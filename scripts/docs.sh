#!/usr/bin/env bash
# Build the documentation site into site/ (git-ignored) with warnings as errors: a broken
# link or anchor, or an API name the reference no longer finds, fails the build.
# Usage: bash scripts/docs.sh [extra mkdocs build options]   (preview: .venv/bin/mkdocs serve)
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
if [ ! -x .venv/bin/mkdocs ]; then
    source scripts/bootstrap.sh "dev,docs"
fi
export NO_MKDOCS_2_WARNING=1  # the theme's end-of-life banner: not a build problem
.venv/bin/mkdocs build --strict --clean --site-dir site "$@"
