#!/usr/bin/env bash
# Browser tests drive Debian's Chromium (Playwright cannot download its own browser here).
set -eu
if [ -x /usr/bin/chromium ]; then echo "Chromium: $(/usr/bin/chromium --version 2>/dev/null || echo present)"; exit 0; fi
command -v apt-get >/dev/null || { echo "ERROR: /usr/bin/chromium is missing and apt-get is not available" >&2; exit 1; }
apt-get update -qq >/dev/null 2>&1 || true
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
[ -x /usr/bin/chromium ] || { echo "ERROR: installing chromium failed" >&2; exit 1; }
echo "Chromium installed: $(/usr/bin/chromium --version)"
