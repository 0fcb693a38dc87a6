#!/usr/bin/env bash
# Browser tests drive Debian's Chromium (Playwright cannot download its own browser here).
set -eu
# A CJK font, so the Simplified Chinese console's screenshots show characters, not boxes
# (tests/browser/test_chinese_console.py).
if ! fc-list :lang=zh 2>/dev/null | grep -q . && command -v apt-get >/dev/null; then
  apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-wqy-microhei >/dev/null || true
fi
if [ -x /usr/bin/chromium ]; then echo "Chromium: $(/usr/bin/chromium --version 2>/dev/null || echo present)"; exit 0; fi
command -v apt-get >/dev/null || { echo "ERROR: /usr/bin/chromium is missing and apt-get is not available" >&2; exit 1; }
apt-get update -qq >/dev/null 2>&1 || true
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
[ -x /usr/bin/chromium ] || { echo "ERROR: installing chromium failed" >&2; exit 1; }
echo "Chromium installed: $(/usr/bin/chromium --version)"
