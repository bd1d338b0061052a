# One image for every process of the Procfile: `docker run IMAGE` serves the console
# (web); `release`, `worker`, `maintenance` and `beat` as the command run those lines.
# docs/deployment.md says how to run and configure each.
ARG PYTHON_IMAGE=python:3.13-slim-bookworm

# --- dependencies, in a virtualenv the final image copies --------------------------------
FROM ${PYTHON_IMAGE} AS dependencies
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
COPY pyproject.toml /tmp/pyproject.toml
# The project's dependencies as pyproject.toml lists them, without the dev extras. The
# project itself is not installed: it runs from /app, where its settings find the
# templates and static files beside the code.
RUN python -c "import tomllib; print(*tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" > /tmp/requirements.txt \
    && /opt/venv/bin/pip install -r /tmp/requirements.txt

# --- the image -------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    DJANGO_PRODUCTION=1
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin app
COPY --from=dependencies /opt/venv /opt/venv
WORKDIR /app
COPY . .
# The static files are collected and hashed here, so every web container serves them from
# the image (WhiteNoise) and no volume is shared. Production settings refuse to start
# without a secret key, hosts and real remotes: this one command gets a key made for it
# and placeholder addresses, none of them kept in the image. The folder belongs to the
# app user because the Procfile's release line collects again (finding the same files).
# So does var/, where beat keeps its schedule file (TASKS_BEAT_SCHEDULE_FILE).
RUN DJANGO_SECRET_KEY="$(python -c 'import secrets; print(secrets.token_urlsafe(50))')" \
    DJANGO_ALLOWED_HOSTS=build.invalid \
    DATABASE_URL=postgres://build.invalid/unused \
    REDIS_URL=redis://build.invalid:6379/0 \
    PUBLISH_URL=https://publish.invalid/ \
    MAIL_URL=https://mail.invalid/ \
    python manage.py collectstatic --noinput \
    && python -m compileall -q config tasks_app approvals console \
    && mkdir -p var \
    && chown -R app:app staticfiles var
USER app
# gunicorn binds 0.0.0.0:$PORT (the Procfile's web line; 8000 unless PORT says otherwise).
EXPOSE 8000
# No HEALTHCHECK: it would apply to the worker, maintenance and beat containers too, which
# serve no HTTP. The orchestrator probes the web containers (docs/deployment.md).
ENTRYPOINT ["/app/scripts/docker-entrypoint.sh"]
CMD ["web"]
