#!/usr/bin/env bash
# Make PostgreSQL and Redis reachable on 127.0.0.1, starting (or installing) them if needed.
# Fails loudly: tests never skip because a service is missing.
set -u

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
redis_up() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; }

apt_install() {
  command -v apt-get >/dev/null || return 1
  [ -n "${APT_UPDATED:-}" ] || { apt-get update -qq >/dev/null 2>&1; APT_UPDATED=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1
}

if ! pg_up; then
  command -v pg_ctlcluster >/dev/null || apt_install postgresql
  if command -v pg_ctlcluster >/dev/null; then
    version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
    [ -n "$version" ] && pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>/dev/null
    for _ in $(seq 1 30); do pg_up && break; sleep 0.5; done
  fi
fi
if ! redis_up; then
  command -v redis-server >/dev/null || apt_install redis-server
  if command -v redis-server >/dev/null; then
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log >/dev/null 2>&1
    for _ in $(seq 1 30); do redis_up && break; sleep 0.2; done
  fi
fi

ok=1
pg_up && echo "PostgreSQL: accepting connections on 127.0.0.1:5432" || { echo "ERROR: PostgreSQL is not reachable on 127.0.0.1:5432 and could not be started" >&2; ok=0; }
redis_up && echo "Redis: PONG on 127.0.0.1:6379" || { echo "ERROR: Redis is not reachable on 127.0.0.1:6379 and could not be started" >&2; ok=0; }
[ "$ok" = 1 ]
