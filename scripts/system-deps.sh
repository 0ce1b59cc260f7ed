#!/usr/bin/env bash
# System packages the suite needs beyond Python: a Java runtime (Spark) and Chromium
# (admin browser tests). Installs only what is missing; needs root or sudo for apt-get.
set -uo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || need+=(chromium)
[ -f /usr/share/java/postgresql.jar ] || need+=(libpostgresql-jdbc-java)
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "==> installing system packages: ${need[*]}"
    $SUDO apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 \
        || echo "warning: could not install ${need[*]}; tests needing them will fail" >&2
fi
exit 0
