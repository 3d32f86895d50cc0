# The htmqc container image (README "Deploying"):
#
#   docker build -t htmqc:0.1.0 .
#   docker run --rm -p 9108:9108 htmqc:0.1.0 run examples.transform:upper \
#       --bootstrap kafka:9092 --topic orders --group orders-upper \
#       --mode exactly-once --sink kafka:orders-upper
#
# Stage "build" makes the wheel of htmqc; stage "runtime" installs it (with its
# dependencies from the package index) on python:3.11-slim and runs `htmqc` as an
# unprivileged user; the sources and build tools stay behind in "build". Your handler
# goes in /app, the working directory (first on sys.path for `htmqc run`): an image
# `FROM htmqc:0.1.0` that COPYs it there.
# tests/deploy/test_container.py checks these facts against the project.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
# Extras installed with it: postgres for postgresql:// sinks.
ARG EXTRAS=postgres
RUN groupadd --system --gid 10001 htmqc \
 && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin htmqc
COPY --from=build /wheels /wheels
RUN python -m pip install --no-cache-dir "$(ls /wheels/htmqc-*.whl)[${EXTRAS}]" \
 && rm -rf /wheels
WORKDIR /app
COPY examples ./examples
# HTMQC_* variables are `htmqc run` options (src/htmqc/config.py): serve /metrics,
# /state, /healthz and /readyz on every interface of the container, on the EXPOSEd port.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HTMQC_METRICS_PORT=9108 \
    HTMQC_METRICS_HOST=0.0.0.0 \
    HTMQC_LOG_FORMAT=json
# Numeric, so Kubernetes' runAsNonRoot can check it.
USER 10001:10001
EXPOSE 9108
# Liveness of `htmqc run` (slim has no curl): urlopen raises on a 503 or no answer.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('HTMQC_METRICS_PORT', '9108'), timeout=4)"]
# SIGTERM (docker stop, Kubernetes) reaches htmqc as PID 1; it handles it and stops
# within --shutdown-seconds (10 s by default); give `docker stop` more (-t 30).
STOPSIGNAL SIGTERM
ENTRYPOINT ["htmqc"]
CMD ["--help"]
