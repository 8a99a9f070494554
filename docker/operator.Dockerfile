# syntax=docker/dockerfile:1
# minedraft operator (kopf): reconciles MineDraftDeployment and SpeculationPolicy resources.
# Its own distribution (operator/pyproject.toml); no torch, no minedraft package.
# Build from the repository root: docker build -f docker/operator.Dockerfile -t minedraft-operator .

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY operator ./operator
RUN pip wheel --no-deps --wheel-dir /wheels ./operator \
 && python -m venv /opt/minedraft-operator \
 && /opt/minedraft-operator/bin/pip install /wheels/minedraft_operator-*.whl \
 && /opt/minedraft-operator/bin/python -c "import minedraft_operator"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="minedraft-operator" \
      org.opencontainers.image.description="minedraft Kubernetes operator" \
      org.opencontainers.image.source="https://github.com/minedraft/minedraft" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin minedraft
COPY --from=build /opt/minedraft-operator /opt/minedraft-operator
ENV PATH=/opt/minedraft-operator/bin:$PATH PYTHONUNBUFFERED=1 HOME=/tmp
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["python", "-m", "minedraft_operator"]
CMD ["--all-namespaces"]
