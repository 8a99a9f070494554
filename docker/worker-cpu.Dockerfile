# syntax=docker/dockerfile:1
# minedraft worker for CPU (verifier and draft service; the CPU profile with the bundled tiny pair).
# torch comes from the PyTorch CPU index (a plain `torch` requirement would pull the CUDA build).
# Build from the repository root: docker build -f docker/worker-cpu.Dockerfile -t minedraft-worker-cpu .
# Layout: /opt/minedraft/venv (the package), /opt/minedraft/models/{tiny-target,tiny-draft,tiny-eagle} (the
# bundled pair and the pair's EAGLE head, links into the package; MineDraftDeployment
# spec.images.bundledModelsDir points here).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY proto ./proto
COPY services ./services
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/minedraft/venv \
 && /opt/minedraft/venv/bin/pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" \
 && /opt/minedraft/venv/bin/pip install "$(echo /wheels/minedraft-*.whl)[worker]" \
 && /opt/minedraft/venv/bin/python -c "import torch, minedraft.verifier.main, minedraft.draft_service.main; print(torch.__version__)" \
 && mkdir /opt/minedraft/models \
 && /opt/minedraft/venv/bin/python -c "import os, minedraft.bundled as b; [os.symlink(p, f'/opt/minedraft/models/{p.name}') for p in (b.TINY_TARGET, b.TINY_DRAFT, b.TINY_EAGLE)]"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="minedraft-worker-cpu" \
      org.opencontainers.image.description="minedraft verifier and draft service on CPU (bundled tiny model pair)" \
      org.opencontainers.image.source="https://github.com/minedraft/minedraft" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin minedraft
COPY --from=build /opt/minedraft /opt/minedraft
ENV PATH=/opt/minedraft/venv/bin:$PATH PYTHONUNBUFFERED=1 HOME=/tmp \
    MINEDRAFT_HOST=0.0.0.0 MINEDRAFT_DEVICE=cpu MINEDRAFT_DTYPE=float32
USER 10001:10001
EXPOSE 50061 50062
ENTRYPOINT ["minedraft"]
CMD ["verifier"]
