# Ember for GPU hosts: the control plane or a node agent, chosen by the command.
#   docker build --build-arg TORCH_INDEX_URL=<PyTorch's cu124 wheel index> -t ember .
#   docker run --net=host ember python -m ember_platform --nats nats://NATS_HOST:4222 --host 0.0.0.0
#   docker run --net=host --gpus all ember python -m ember_runtime --nats nats://NATS_HOST:4222
# Not built in CI (no Docker engine there); keep it to these few steps.
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/ember
ENV PATH=/opt/ember/bin:$PATH

WORKDIR /src
COPY pyproject.toml README.md ./
COPY sdk sdk
COPY platform platform
COPY runtime runtime
# The CUDA build of torch first (from PyTorch's wheel index for CUDA 12.4, passed as TORCH_INDEX_URL),
# so that the gpu extra does not pull another build.
ARG TORCH_INDEX_URL
RUN pip install --no-cache-dir torch ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
    && pip install --no-cache-dir '.[gpu]'

EXPOSE 8700
CMD ["python", "-m", "ember_platform", "--host", "0.0.0.0", "--port", "8700"]
