#!/usr/bin/env bash
# Builds the container image and checks that it runs (`make docker-check`; CI calls it).
# Without Docker it says it skipped the build and succeeds: tests/project/test_dockerfile.py, part
# of `make test`, lints the Dockerfile, the entrypoint and .dockerignore without Docker.
#
# With Docker:
#  1. builds the image (DOCKER_CHECK_PYTHON_IMAGE names another base, e.g. from a mirror);
#  2. checks that the image starts in production mode: with no settings it refuses to start,
#     and with them `manage.py check --deploy` finds nothing;
#  3. with DATABASE_URL and REDIS_URL set (CI sets them), runs every Procfile process from
#     the image against them: release on a scratch database, then web, worker, maintenance
#     and beat; the console's login page and a hashed stylesheet must load, a task enqueued
#     from another container must succeed, and each process must stop on SIGTERM in time.
#     The containers use the host's network, so loopback addresses in the URLs work.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "docker-check: $*"; }

if ! docker info >/dev/null 2>&1; then
  say "skipped the image build: Docker is not available ('docker info' failed)."
  say "tests/project/test_dockerfile.py (make test) lints the Dockerfile instead."
  exit 0
fi

image=${DOCKER_CHECK_IMAGE:-task-console:check}
base=${DOCKER_CHECK_PYTHON_IMAGE:-$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile)}
if ! docker image inspect "$base" >/dev/null 2>&1 && ! docker pull "$base"; then
  # Docker without a registry to pull from: as good as no Docker for this check.
  say "skipped the image build: the base image $base is not here and cannot be pulled."
  say "Set DOCKER_CHECK_PYTHON_IMAGE to one that is; tests/project/test_dockerfile.py lints the Dockerfile."
  exit 0
fi

started=$SECONDS
docker build --build-arg "PYTHON_IMAGE=$base" --tag "$image" .
say "built $image from $base in $((SECONDS - started)) s"

secret_key=$(python3 -c 'import secrets; print(secrets.token_urlsafe(50))')
production=(
  --env "DJANGO_SECRET_KEY=$secret_key"
  --env DJANGO_ALLOWED_HOSTS=console.example.com
  --env PUBLISH_URL=https://publish.example.com/api/
  --env MAIL_URL=https://mail.example.com/api/
)

# 2. Production mode is the image's default: no secret key, no start.
if refusal=$(docker run --rm "$image" python manage.py check 2>&1); then
  say "FAILED: the image started without DJANGO_SECRET_KEY"
  exit 1
fi
grep -q "DJANGO_SECRET_KEY is required" <<<"$refusal" || {
  echo "$refusal" >&2
  say "FAILED: the image did not say why it refused to start"
  exit 1
}
say "without settings the image refuses to start (DJANGO_SECRET_KEY is required)"
docker run --rm "${production[@]}" \
  --env DATABASE_URL=postgres://db.invalid/unused --env REDIS_URL=redis://redis.invalid:6379/0 \
  "$image" python manage.py check --deploy --fail-level WARNING
say "manage.py check --deploy passes in the image with production settings"

if [ -z "${DATABASE_URL:-}" ] || [ -z "${REDIS_URL:-}" ]; then
  say "skipped running the processes: set DATABASE_URL and REDIS_URL to run them against"
  exit 0
fi

# 3. Every process against the real services, on a scratch database and broker prefix.
run_id="docker-check-$$"
database="docker_check_$$"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The scratch database, made and dropped through the server DATABASE_URL names.
admin() {
  docker run --rm --network host --env "DATABASE_URL=$DATABASE_URL" "$image" python -c "
import sys, psycopg
from urllib.parse import urlsplit
url = urlsplit(sys.argv[2])
with psycopg.connect(url._replace(path='/postgres').geturl(), autocommit=True) as conn:
    conn.execute(sys.argv[1].replace('NAME', '\"' + '$database' + '\"'))
" "$1" "$DATABASE_URL"
}
scratch_url=$(python3 -c 'import sys; from urllib.parse import urlsplit; print(urlsplit(sys.argv[1])._replace(path="/" + sys.argv[2]).geturl())' "$DATABASE_URL" "$database")
env_file=$(mktemp)
chmod 600 "$env_file"
cat >"$env_file" <<ENV
DJANGO_SECRET_KEY=$secret_key
DJANGO_ALLOWED_HOSTS=console.example.com
PUBLISH_URL=https://publish.example.com/api/
MAIL_URL=https://mail.example.com/api/
DATABASE_URL=$scratch_url
REDIS_URL=$REDIS_URL
TASKS_BROKER_PREFIX=$run_id:
PORT=$port
ENV
in_image() { docker run --rm --network host --env-file "$env_file" "$@"; }

processes=(web worker maintenance beat)
cleanup() {
  for name in "${processes[@]}"; do docker rm --force "$run_id-$name" >/dev/null 2>&1 || true; done
  in_image "$image" python -c "
import os, redis
client = redis.Redis.from_url(os.environ['REDIS_URL'])
keys = list(client.scan_iter(match=os.environ['TASKS_BROKER_PREFIX'] + '*'))
if keys:
    client.delete(*keys)
" >/dev/null 2>&1 || true
  admin 'DROP DATABASE IF EXISTS NAME WITH (FORCE)' >/dev/null 2>&1 || true
  rm -f "$env_file"
}
trap cleanup EXIT

admin 'CREATE DATABASE NAME'
in_image "$image" release
say "release ran: migrations applied and static files collected, as the app user"

for name in "${processes[@]}"; do
  docker run --detach --name "$run_id-$name" --network host --env-file "$env_file" \
    "$image" "$name" >/dev/null
done

# The console's login page and the stylesheet it links (its hashed name comes from the
# manifest collectstatic wrote), through the web container as a TLS-ending proxy would ask;
# then a task enqueued from another container, run by the worker container.
if ! in_image --interactive "$image" python manage.py shell --no-imports <<'PY'; then
import os
import re
import time
import urllib.request

from tasks_app import services

base = f"http://127.0.0.1:{os.environ['PORT']}"
headers = {"Host": "console.example.com", "X-Forwarded-Proto": "https"}


def get(path):
    request = urllib.request.Request(base + path, headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status, response.read().decode()


deadline = time.monotonic() + 60
while True:
    try:
        status, page = get("/accounts/login/")
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
stylesheet = re.search(r'href="(/static/[^"]+\.[0-9a-f]{12}\.css)"', page)
assert status == 200 and stylesheet, (status, page[:500])
assert get(stylesheet.group(1))[0] == 200
print(f"docker-check: the web container serves the login page and {stylesheet.group(1)}")

task = services.enqueue("demo.noop", {}, idempotency_key="docker-check", actor="cli:docker-check").task
deadline = time.monotonic() + 60
while task.status != "succeeded":
    assert time.monotonic() < deadline, f"task {task.pk} is still {task.status}"
    time.sleep(0.5)
    task.refresh_from_db()
print(f"docker-check: task {task.pk}, enqueued from a container, succeeded in the worker container")
PY
  for name in "${processes[@]}"; do
    echo "--- $name" >&2
    docker logs --tail 40 "$run_id-$name" >&2 || true
  done
  say "FAILED: the processes did not serve and run work (their logs are above)"
  exit 1
fi

# docker stop sends SIGTERM, then SIGKILL after the timeout (exit status 137). Each process
# must get the SIGTERM itself and stop well before that.
for name in "${processes[@]}"; do
  started=$SECONDS
  docker stop --time 30 "$run_id-$name" >/dev/null
  status=$(docker inspect --format '{{.State.ExitCode}}' "$run_id-$name")
  if [ "$status" = 137 ]; then
    say "FAILED: $name ignored SIGTERM and was killed"
    exit 1
  fi
  say "$name stopped on SIGTERM in $((SECONDS - started)) s (exit status $status)"
done
say "passed"
