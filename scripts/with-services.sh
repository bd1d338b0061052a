#!/usr/bin/env bash
# Run a command against PostgreSQL and Redis: those named by DATABASE_URL / REDIS_URL, or
# else the local ones on 127.0.0.1. Fails with instructions when they are unreachable.
set -euo pipefail
cd "$(dirname "$0")/.."

user=${PGUSER:-$(whoami)}
export DATABASE_URL=${DATABASE_URL:-postgres://${user}@127.0.0.1:5432/task_console}
export REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
# Every run has its own broker keys, so runs sharing a Redis never see each other's messages.
export TASKS_BROKER_PREFIX=${TASKS_BROKER_PREFIX:-test-$(date +%s)-$$:}

if ! .venv/bin/python scripts/check_services.py; then
  cat >&2 <<'MSG'

The tests need PostgreSQL 15+ and Redis. Start the local ones with:
  pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
or point DATABASE_URL / REDIS_URL at running servers.
MSG
  exit 1
fi
exec "$@"
