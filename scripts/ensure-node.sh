#!/usr/bin/env bash
# The TypeScript client (clients/typescript) is built and tested with Node 20+ and npm; the
# browser tests install axe-core with npm (`make axe`).
# Installs them with apt if missing; fails loudly if it cannot, or if apt's Node is too old.
set -eu
NEED_MAJOR=20

node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

ok() {
  command -v node >/dev/null && command -v npm >/dev/null && [ "$(node_major)" -ge "$NEED_MAJOR" ]
}

if ok; then echo "Node: $(node --version), npm $(npm --version)"; exit 0; fi

command -v apt-get >/dev/null || {
  echo "ERROR: Node $NEED_MAJOR+ and npm are needed for the TypeScript client and apt-get is not available" >&2
  exit 1
}
apt-get update -qq >/dev/null 2>&1 || true
missing=""
command -v node >/dev/null || missing="$missing nodejs"
command -v npm >/dev/null || missing="$missing npm"
[ "$(node_major)" -ge "$NEED_MAJOR" ] || missing="$missing nodejs"
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null || {
  echo "ERROR: 'apt-get install$missing' failed: install Node $NEED_MAJOR+ and npm yourself" >&2
  exit 1
}
if ! ok; then
  echo "ERROR: after apt-get, node is $(node --version 2>/dev/null || echo missing) and npm is" \
    "$(npm --version 2>/dev/null || echo missing); the TypeScript client needs Node $NEED_MAJOR+" \
    "(this distribution's apt may be older: use the NodeSource repository or nvm)" >&2
  exit 1
fi
echo "Node installed: $(node --version), npm $(npm --version)"
