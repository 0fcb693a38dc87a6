#!/usr/bin/env bash
# The scale-out bench (bench/bench_scale.py) puts N daphne processes behind Debian's nginx, run in
# the foreground as the bench's own process with a generated config: the system service is never
# started. nginx-light is enough (upstream, proxy, websockets); any nginx already on PATH will do.
set -eu
found="$(command -v nginx || true)"
[ -n "$found" ] || { [ -x /usr/sbin/nginx ] && found=/usr/sbin/nginx; }
if [ -n "$found" ]; then echo "nginx: $("$found" -v 2>&1)"; exit 0; fi
command -v apt-get >/dev/null || { echo "ERROR: nginx is missing and apt-get is not available" >&2; exit 1; }
# A package's postinst starts its service unless policy-rc.d says no (101); where no policy
# exists, one is put in place for the install only, so no system nginx grabs port 80.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1
fi
trap '[ "$made_policy" = 1 ] && rm -f "$policy"' EXIT
apt-get update -qq >/dev/null 2>&1 || true
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
[ -x /usr/sbin/nginx ] || { echo "ERROR: installing nginx-light failed" >&2; exit 1; }
echo "nginx installed: $(/usr/sbin/nginx -v 2>&1)"
