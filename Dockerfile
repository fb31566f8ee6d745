# Ember for GPU hosts: one image for the control plane and the node agent, chosen by the command.
#   docker build --build-arg TORCH_INDEX_URL=<PyTorch's cu124 wheel index> -t ember .
#   docker run --net=host -v /etc/ember:/etc/ember:ro ember python -m ember_platform --nats nats://NATS_HOST:4222 \
#       --nats-auth-dir /etc/ember/nats-auth --bootstrap-token-file /etc/ember/admin-token \
#       --secrets-key-file /etc/ember/secrets.key --host 0.0.0.0
#   docker run --net=host --gpus all --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#       --security-opt systempaths=unconfined -v /var/lib/ember:/var/lib/ember \
#       -v /etc/ember/gpu-01.creds:/etc/ember/node.creds:ro ember python -m ember_runtime \
#       --nats nats://NATS_HOST:4222 --nats-creds /etc/ember/node.creds
# (the agent's sandboxes need those three options, and its state a volume: docs/operations/install.md)
# Both refuse to start without NATS credentials (README, "NATS credentials") unless told --insecure-no-auth
# (--insecure-no-nats-auth for the control plane), which they then log as INSECURE.
# Two stages: the first builds the Python environment with compilers at hand; the image keeps only that
# environment, the interpreter, tini and the CA certificates. It runs as user ember (uid 10001) under tini,
# which forwards signals and reaps orphaned processes (replicas' children), with or without `docker run --init`.
# Checked in tests/unit/deploy/test_dockerfile.py (no Docker engine in CI).
ARG BASE_IMAGE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

FROM ${BASE_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev build-essential \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/ember
ENV PATH=/opt/ember/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sdk sdk
COPY platform platform
COPY runtime runtime
# The CUDA build of torch first (from PyTorch's wheel index for CUDA 12.4, passed as TORCH_INDEX_URL),
# so that the gpu extra does not pull another build. A wheel install, not an editable one: /src stays here.
# The tracing extra too: spans are exported only where OTEL_* variables ask for them (README, "Tracing").
ARG TORCH_INDEX_URL
RUN pip install torch ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
    && pip install '.[gpu,tracing]'

FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
# passt (pasta) gives each replica's sandbox a network of its own; a base image that does not package it (Ubuntu
# before 23.04) runs sandboxes on the node's network, and the agent and `ember status` say so.
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 tini ca-certificates \
    && (apt-get install -y --no-install-recommends passt || echo "passt is not packaged here: no network per sandbox") \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 ember \
    && useradd --system --uid 10001 --gid ember --home-dir /home/ember --create-home --shell /usr/sbin/nologin ember \
    && install -d -o ember -g ember -m 0750 /var/lib/ember
COPY --from=build /opt/ember /opt/ember
COPY deploy/docker/healthcheck.py /opt/ember/healthcheck.py
ENV PATH=/opt/ember/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 EMBER_STATE_DIR=/var/lib/ember
USER 10001:10001
WORKDIR /home/ember
EXPOSE 8700
# The control plane: healthy while /healthz answers; the node agent (no port): while it runs.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 CMD ["python", "/opt/ember/healthcheck.py"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["python", "-m", "ember_platform", "--host", "0.0.0.0", "--port", "8700"]
