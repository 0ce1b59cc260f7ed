#!/usr/bin/env bash
# System packages the test suite needs beyond Python, and why:
#   default-jre-headless     a Java runtime for the Spark pipeline tests (-m spark)
#   libpostgresql-jdbc-java  the PostgreSQL JDBC driver Spark reads and writes through
#   chromium                 the browser the admin browser tests drive (-m browser)
#   bash scripts/system-deps.sh           install what is missing (apt-get; root or sudo)
#   bash scripts/system-deps.sh --check   only list what is missing (exit 2 if anything is)
set -uo pipefail
need=()
why=()
if ! command -v java >/dev/null 2>&1; then
    need+=(default-jre-headless); why+=("a Java runtime for the Spark pipeline tests")
fi
if [ ! -f /usr/share/java/postgresql.jar ]; then
    need+=(libpostgresql-jdbc-java); why+=("the PostgreSQL JDBC driver for the Spark pipeline tests")
fi
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
    need+=(chromium); why+=("the browser of the admin browser tests")
fi
[ ${#need[@]} -eq 0 ] && exit 0

for i in "${!need[@]}"; do
    printf '    %-24s %s\n' "${need[$i]}" "${why[$i]}"
done
if [ "${1:-}" = "--check" ]; then
    exit 2
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "==> installing the system packages above: $SUDO apt-get install ${need[*]}"
$SUDO apt-get update -qq || echo "warning: apt-get update failed; trying the install anyway" >&2
# One line per package fetched and set up, so a long install shows progress.
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}" \
    | grep --line-buffered -E '^(Get:|Setting up|E:)' | sed -u 's/^/    /'
missing_after=$(bash "$0" --check) || {
    echo "could not install:" >&2
    echo "$missing_after" >&2
    exit 1
}
exit 0
