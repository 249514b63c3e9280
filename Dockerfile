# The gpujob operator image: slim Python, the operator's dependencies only (no torch, no
# NVML: those are the `trainer` extra), running as an unprivileged user.
#   docker build -t gpujob-operator .
# The chart runs it as `gpujob operator ...` with a read-only root filesystem.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/gpujob
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY trainer_image/gpujob_trainer/ trainer_image/gpujob_trainer/
COPY localcluster/ localcluster/
# A regular (non-editable) install of the distribution, without extras.
RUN /opt/gpujob/bin/pip install --no-compile . \
    && /opt/gpujob/bin/python -c "import gpujob_operator.runtime.main, gpujob_operator.observability.opmetrics"

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="gpujob-operator" \
      org.opencontainers.image.description="Kubernetes operator for multi-node PyTorch training with progress, ETA and bottleneck verdicts" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpujob/gpujob"
ENV PATH=/opt/gpujob/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/gpujob /opt/gpujob
# 65532: the conventional "nonroot" UID; the chart's securityContext uses the same.
RUN groupadd --system --gid 65532 gpujob \
    && useradd --system --uid 65532 --gid gpujob --no-create-home --shell /usr/sbin/nologin gpujob
USER 65532:65532
WORKDIR /tmp
# 8080: kopf liveness (/healthz); 8081: the operator's /metrics.
EXPOSE 8080 8081
ENTRYPOINT ["gpujob"]
CMD ["operator"]
