# syntax=docker/dockerfile:1
# Context Memory Service: multi-stage build; the final image has no compilers and runs as a
# non-root user. The same image runs `serve`, `worker` and `migrate` (see docker-compose.yml).

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /build
COPY pyproject.toml ./
# install the pinned runtime dependencies only; the application runs from /srv/app
RUN python -m venv /opt/venv \
 && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
 && /opt/venv/bin/pip install --no-cache-dir -r requirements.txt

FROM python:3.11-slim-bookworm AS runtime
RUN groupadd --system --gid 10001 app \
 && useradd --system --uid 10001 --gid app --home-dir /srv --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
WORKDIR /srv
COPY --chown=app:app alembic.ini pyproject.toml ./
COPY --chown=app:app migrations ./migrations
COPY --chown=app:app app ./app
# the commit the image is built from, for the build_info metric:
#   docker build --build-arg BUILD_COMMIT=$(git rev-parse HEAD) .
ARG BUILD_COMMIT=unknown
ENV BUILD_COMMIT=$BUILD_COMMIT \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    ENVIRONMENT=production
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=3)"]
CMD ["python", "-m", "app", "serve", "--host", "0.0.0.0", "--port", "8000"]
