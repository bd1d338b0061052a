#!/usr/bin/env bash
# Run a command against a PostgreSQL and a Redis of its own, on spare ports, which the
# fault drills (make chaos) may stop, restart, pause and kill without touching the
# machine's shared servers. Both are removed when the command ends.
#
# PostgreSQL refuses to run as root: when run as root, initdb and the server run as the
# `postgres` user (runuser). The command gets DATABASE_URL and REDIS_URL for them, and
# CHAOS_* variables saying how to control them (tests/chaos/services.py reads those).
set -euo pipefail
cd "$(dirname "$0")/.."

pg_bin=${CHAOS_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ]; then
  pg_bin=$(dirname "$(command -v initdb || command -v pg_ctl || echo /nonexistent)")
fi
[ -x "$pg_bin/initdb" ] || { echo "make chaos needs PostgreSQL's initdb and pg_ctl" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "make chaos needs redis-server" >&2; exit 1; }

spare_port() {
  .venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

dir=$(mktemp -d /tmp/chaos-services.XXXXXX)
chmod 755 "$dir"
as_pg=()
pg_user=$(whoami)
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || { echo "running as root, make chaos needs a postgres user" >&2; exit 1; }
  as_pg=(runuser -u postgres --)
  pg_user=postgres
fi
mkdir -p "$dir/pg" "$dir/socket" "$dir/log"
[ ${#as_pg[@]} -eq 0 ] || chown postgres "$dir/pg" "$dir/socket" "$dir/log"
pg_port=$(spare_port)
redis_port=$(spare_port)

cleanup() {
  "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$dir/pg" stop -m immediate >/dev/null 2>&1 || true
  redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
  [ -f "$dir/redis.pid" ] && kill -CONT "$(cat "$dir/redis.pid")" 2>/dev/null || true
  redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

"${as_pg[@]}" "$pg_bin/initdb" -D "$dir/pg" -U "$pg_user" -A trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 \
  || { cat "$dir/initdb.log" >&2; exit 1; }
# fsync off: the drills crash the server process, never the machine, so the kernel keeps
# every write; restarts replay the WAL as after any crash.
pg_options="-p $pg_port -k $dir/socket -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$dir/pg" -o "$pg_options" -l "$dir/log/postgresql.log" -w start >/dev/null \
  || { cat "$dir/log/postgresql.log" >&2; exit 1; }

redis_args=(--port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir"
  --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --daemonize yes)
redis-server "${redis_args[@]}"
for _ in $(seq 1 50); do
  redis-cli -p "$redis_port" ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done

export DATABASE_URL="postgres://${pg_user}@127.0.0.1:${pg_port}/chaos"
export REDIS_URL="redis://127.0.0.1:${redis_port}/0"
export TASKS_BROKER_PREFIX=""
export CHAOS_DIR="$dir" CHAOS_PG_BIN="$pg_bin" CHAOS_PG_DATA="$dir/pg" CHAOS_PG_OPTIONS="$pg_options"
export CHAOS_PG_LOG="$dir/log/postgresql.log" CHAOS_PG_PORT="$pg_port"
export CHAOS_PG_AS="${as_pg[*]}" CHAOS_REDIS_ARGS="$(printf "%q " "${redis_args[@]}")" CHAOS_REDIS_PORT="$redis_port"

.venv/bin/python scripts/check_services.py
set +e
"$@"
status=$?
set -e
exit "$status"
