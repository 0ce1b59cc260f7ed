#!/usr/bin/env bash
# Dependency audit: every package installed in .venv (the dev, spark and test extras and
# what they pull in) checked with pip-audit against PyPI's vulnerability data. A known
# vulnerability fails (exit 1, each one listed with the versions that fix it). Packages the
# service could not be asked about are counted on one line, so an audit that could not reach
# the data says so instead of passing in silence.
set -euo pipefail
cd "$(dirname "$0")/.."
report="$(mktemp)" log="$(mktemp)"
trap 'rm -f "$report" "$log"' EXIT
status=0
# Its own summary says "No known vulnerabilities found" even when it could ask about
# nothing: the line below says what was audited. Its log is shown when it fails.
.venv/bin/pip-audit --skip-editable --progress-spinner off --desc off -f json -o "$report" \
    2>"$log" || status=$?
if [ ! -s "$report" ]; then
    cat "$log" >&2
    exit "$((status ? status : 1))"
fi
.venv/bin/python - "$report" <<'PY'
import json, sys

dependencies = json.load(open(sys.argv[1]))["dependencies"]
skipped = [d for d in dependencies if "skip_reason" in d]
found = [(d, v) for d in dependencies for v in d.get("vulns", [])]
for dependency, vuln in found:
    fixed = ", ".join(vuln.get("fix_versions") or []) or "no fixed release"
    print(f"{dependency['name']} {dependency['version']}: {vuln['id']} (fixed in {fixed})")
print(
    f"dependency audit: {len(dependencies) - len(skipped)} of {len(dependencies)} packages "
    f"audited, {len(found)} known vulnerabilities"
    + (f"; {len(skipped)} not audited (no vulnerability data reached)" if skipped else "")
)
PY
exit "$status"
