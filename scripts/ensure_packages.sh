#!/usr/bin/env bash
# Installs the Debian packages a test needs when their command is missing:
#   scripts/ensure_packages.sh COMMAND=PACKAGE ...   (e.g. chromium=chromium initdb=postgresql)
# The test suite calls it (tests/conftest.py), so `make test` sets up what it uses;
# nothing is installed by hand. Needs root and the Debian mirror.
set -euo pipefail
find_missing() {
    missing=()
    for pair in "$@"; do
        command="${pair%%=*}" package="${pair#*=}"
        command -v "$command" >/dev/null 2>&1 || [ -x "$command" ] || missing+=("$package")
    done
}
find_missing "$@"
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "ensure_packages: ${missing[*]} missing and not root: install them (apt-get install ${missing[*]})" >&2
    exit 1
fi
# The test processes (pytest -n) may ask at once; apt allows one at a time. The second waits,
# then finds the first installed what it needed.
exec 9>/run/lock/drover-ensure-packages
flock 9
find_missing "$@"
[ ${#missing[@]} -eq 0 ] && exit 0
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
