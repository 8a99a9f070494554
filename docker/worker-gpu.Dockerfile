# syntax=docker/dockerfile:1
# minedraft worker for NVIDIA GPUs (verifier and draft service): CUDA 13 runtime, torch 2.13 (CUDA 13 build).
# Build from the repository root: docker build -f docker/worker-gpu.Dockerfile -t minedraft-worker-gpu .
# Layout: /opt/minedraft/venv (the package), /opt/minedraft/models/{tiny-target,tiny-draft,tiny-eagle} (the
# bundled pair and the pair's EAGLE head, links into the package; MineDraftDeployment
# spec.images.bundledModelsDir points here).
#
# One deliberate exception to "no build tools in the final stage": the engine's Triton kernels
# (paged attention, fused norm/rope/silu) make Triton compile a small C launcher with the
# system compiler the first time each kernel runs, against Python's headers. Without gcc and
# python3-dev the verifier fails at its first CUDA step, so the final stage keeps those two.

ARG CUDA_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04

FROM ${CUDA_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
# Ubuntu's python3 (3.12); package versions follow the pinned base image's archive snapshot.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY proto ./proto
COPY services ./services
RUN python3 -m venv /opt/minedraft/venv \
 && /opt/minedraft/venv/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/minedraft/venv/bin/pip install "torch==${TORCH_VERSION}" \
 && /opt/minedraft/venv/bin/pip install "$(echo /wheels/minedraft-*.whl)[worker]" \
 && /opt/minedraft/venv/bin/python -c "import torch, triton, minedraft.verifier.main; print(torch.__version__, torch.version.cuda)" \
 && mkdir /opt/minedraft/models \
 && /opt/minedraft/venv/bin/python -c "import os, minedraft.bundled as b; [os.symlink(p, f'/opt/minedraft/models/{p.name}') for p in (b.TINY_TARGET, b.TINY_DRAFT, b.TINY_EAGLE)]"

FROM ${CUDA_IMAGE}
LABEL org.opencontainers.image.title="minedraft-worker-gpu" \
      org.opencontainers.image.description="minedraft verifier and draft service on NVIDIA GPUs (CUDA 13)" \
      org.opencontainers.image.source="https://github.com/minedraft/minedraft" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DEBIAN_FRONTEND=noninteractive
# python3 runs the services; gcc + python3-dev are what Triton's launcher build needs (see the top).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 gcc libc6-dev python3-dev \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin minedraft
COPY --from=build /opt/minedraft /opt/minedraft
ENV PATH=/opt/minedraft/venv/bin:$PATH PYTHONUNBUFFERED=1 HOME=/tmp TRITON_CACHE_DIR=/tmp/triton \
    MINEDRAFT_HOST=0.0.0.0 MINEDRAFT_DEVICE=cuda:0 MINEDRAFT_DTYPE=bfloat16 CUDA_DEVICE_ORDER=PCI_BUS_ID
USER 10001:10001
EXPOSE 50061 50062
ENTRYPOINT ["minedraft"]
CMD ["verifier"]
