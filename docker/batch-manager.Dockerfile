# syntax=docker/dockerfile:1
# minedraft batch manager: public gRPC + OpenAI HTTP APIs, CPU only. Installs the torch-free
# base of the package (the `batch-manager` extra): no torch, no CUDA, a small image.
# Build from the repository root: docker build -f docker/batch-manager.Dockerfile -t minedraft-batch-manager .
# Layout: /opt/minedraft/venv (the package), /opt/minedraft/models/{tiny-target,tiny-draft} (the bundled
# pair, links into the package; MineDraftDeployment spec.images.bundledModelsDir points here).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY proto ./proto
COPY services ./services
# The wheel build runs grpcio-tools (a build requirement) to generate the gRPC stubs.
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/minedraft/venv \
 && /opt/minedraft/venv/bin/pip install "$(echo /wheels/minedraft-*.whl)[batch-manager]" \
 && /opt/minedraft/venv/bin/python -c "import minedraft.batch_manager.main, sys; assert 'torch' not in sys.modules" \
 && mkdir /opt/minedraft/models \
 && /opt/minedraft/venv/bin/python -c "import os, minedraft.bundled as b; [os.symlink(p, f'/opt/minedraft/models/{p.name}') for p in (b.TINY_TARGET, b.TINY_DRAFT)]"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="minedraft-batch-manager" \
      org.opencontainers.image.description="minedraft batch manager (CPU, no torch)" \
      org.opencontainers.image.source="https://github.com/minedraft/minedraft" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin minedraft
COPY --from=build /opt/minedraft /opt/minedraft
ENV PATH=/opt/minedraft/venv/bin:$PATH PYTHONUNBUFFERED=1 HOME=/tmp \
    MINEDRAFT_HOST=0.0.0.0 MINEDRAFT_GRPC_PORT=50051 MINEDRAFT_HTTP_PORT=8000
USER 10001:10001
EXPOSE 50051 8000
ENTRYPOINT ["minedraft"]
CMD ["batch-manager"]
