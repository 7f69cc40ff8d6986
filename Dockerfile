# syntax=docker/dockerfile:1
#
# gpu-admission server image.
#   docker build -t gpu-admission:0.1.0 .
# Pin the base by digest in release builds:
#   --build-arg PYTHON_IMAGE=python:3.11-slim@sha256:<digest>
# The builder compiles the policy core (mypyc: setup.py, webhook/compiled.py)
# into the wheel and installs it with its dependencies into a virtual
# environment; the runtime stage receives that environment and nothing else:
# no compiler, no mypy, no pip cache, no source tree, tests or certificates.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The C compiler that mypyc's output needs; this stage only.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
# mypy (mypyc) and setuptools build the wheel from their own environment,
# which the runtime never sees. Pin MYPY in release builds to the version
# `make test` ran the compiled suite with.
ARG MYPY="mypy>=1.8"
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install "setuptools>=77" wheel "${MYPY}" \
 && python -m venv /opt/venv
WORKDIR /src
# .dockerignore lets only pyproject.toml, setup.py, README.md and webhook/ in.
COPY . .
# Every dependency ships manylinux wheels for CPython 3.11; --only-binary
# makes a missing wheel fail the build instead of silently compiling.
# EXTRAS names optional extras to add (e.g. dev). The last line refuses an
# image whose policy core would run interpreted.
ARG EXTRAS=
RUN GPU_ADMISSION_COMPILE=1 /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && wheel="$(ls /wheels/*.whl)" \
 && /opt/venv/bin/pip install --only-binary=:all: "${wheel}${EXTRAS:+[${EXTRAS}]}" \
 && /opt/venv/bin/pip uninstall --yes pip \
 && /opt/venv/bin/gpu-admission --help > /dev/null \
 && cd / && /opt/venv/bin/python -c "from webhook import compiled; assert compiled.policy_core() == 'compiled', compiled.compiled_modules()"

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="gpu-admission" \
      org.opencontainers.image.description="Kubernetes admission webhook policy engine for GPU workloads" \
      org.opencontainers.image.licenses="Apache-2.0"
# The root filesystem is read-only in the cluster: bytecode was compiled at
# install time and nothing may try to write more.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=builder /opt/venv /opt/venv
# Numeric, so that the kubelet can enforce runAsNonRoot without a passwd entry.
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["gpu-admission", "serve"]
# The Kubernetes paths (deploy/base/deployment.yaml mounts them); the
# Deployment repeats these arguments explicitly.
CMD ["--policies", "/etc/gpu-admission/policies", \
     "--tls-cert", "/etc/gpu-admission/tls/tls.crt", \
     "--tls-key", "/etc/gpu-admission/tls/tls.key", \
     "--host", "0.0.0.0", "--port", "8443"]
