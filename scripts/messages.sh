#!/usr/bin/env bash
# The console's message catalogs (locale/<lang>/LC_MESSAGES/django.po, djangojs.po).
#   scripts/messages.sh update   re-extract every string from the code into the .po files
#   scripts/messages.sh compile  build the .mo files Django reads (never committed: *.mo is ignored)
# tests/i18n/test_catalog.py runs `update` on a copy of the tree and fails when the catalog
# would change: a string added without re-running this, or one left in the catalog after its
# code went.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LANGS=(zh_Hans)
# What a person reads lives in the apps and templates; the rest (tests, benches, the agent
# library, clients, docs) is not shown in the console.
IGNORE=(--ignore='.venv*' --ignore=node_modules --ignore=tests --ignore=bench --ignore=clients
  --ignore=agent --ignore=safestop_agent --ignore=docs --ignore=examples --ignore=deploy
  --ignore=scripts --ignore=staticfiles --ignore=var)
case "${1:-}" in
  update)
    for lang in "${LANGS[@]}"; do
      # File names without line numbers: moving a string down a template does not change the
      # catalog, so the freshness check fails only when the strings themselves change.
      "$PY" manage.py makemessages -l "$lang" --no-obsolete --add-location file "${IGNORE[@]}"
      "$PY" manage.py makemessages -d djangojs -l "$lang" --no-obsolete --add-location file \
        "${IGNORE[@]}"
    done
    ;;
  compile)
    "$PY" manage.py compilemessages "${IGNORE[@]}"
    ;;
  *)
    echo "usage: $0 update|compile" >&2
    exit 2
    ;;
esac
