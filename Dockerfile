# safestop: one image for every process (web = daphne, worker = celery worker, beat = celery beat).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=console.settings

WORKDIR /app

# The project runs from its source tree (templates/ and static/ live next to the apps), so it is
# installed in place; dependencies come from pyproject.toml, and the agent side (which the demo
# simulator drives runs through) from its own distribution in agent/.
COPY . /app
RUN pip install -e ./agent -e . \
 && SAFESTOP_SECRET_KEY=collectstatic-only python manage.py collectstatic --noinput --verbosity 0 \
 && useradd --create-home --uid 10001 safestop \
 && chown -R safestop /app/staticfiles \
 && mkdir -p /var/lib/safestop/ledger-anchors && chown -R safestop /var/lib/safestop

# Celery refuses to be comfortable as root, and nothing here needs it.
USER safestop
EXPOSE 8000

# The default is the web process; docker-compose.yml overrides the command for worker and beat.
CMD ["daphne", "--bind", "0.0.0.0", "--port", "8000", "--proxy-headers", "console.asgi:application"]
