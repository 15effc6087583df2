# syntax=docker/dockerfile:1.7
#
# Two images from one file (BuildKit builds only the stages a target needs):
#   docker build --target gpu -t whisper-serve:gpu .   TensorRT-LLM on NVIDIA GPUs (production)
#   docker build --target cpu -t whisper-serve:cpu .   PyTorch on CPU, embedded Whisper base baked in
# See docs/deployment.md.

# TensorRT-LLM release container. Whisper's PyTorch-backend model loads from 1.3.0rc25 on;
# 1.3.0rc29 is the newest 1.3.x tag this file was checked against.
ARG TRTLLM_VERSION=1.3.0rc29
# 1 = rebuild TensorRT-LLM from source with the capacity-scheduler guard (hours; see
# docker/build-trtllm-with-guard.sh). 0 = use the container's TensorRT-LLM as shipped.
ARG TRTLLM_SCHEDULER_GUARD=0
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# CPU wheel of torch for the cpu image; keep equal to the pin in README and .ci.
ARG TORCH_VERSION=2.13.0

############################################################################################
# GPU: TensorRT-LLM base, optionally with a guarded TensorRT-LLM build
############################################################################################
FROM nvcr.io/nvidia/tensorrt-llm/release:${TRTLLM_VERSION} AS trtllm-guard-0

FROM nvcr.io/nvidia/tensorrt-llm/devel:${TRTLLM_VERSION} AS trtllm-guard-build
ARG TRTLLM_VERSION
ARG TRTLLM_CUDA_ARCHS="90-real;100-real"
COPY docker/build-trtllm-with-guard.sh docker/trtllm-capacity-scheduler-guard.patch /opt/trtllm-guard/
RUN TRTLLM_CUDA_ARCHS="${TRTLLM_CUDA_ARCHS}" \
    /opt/trtllm-guard/build-trtllm-with-guard.sh "v${TRTLLM_VERSION}" /opt/trtllm-wheel

FROM trtllm-guard-0 AS trtllm-guard-1
COPY --from=trtllm-guard-build /opt/trtllm-wheel /tmp/trtllm-wheel
# --no-deps: only tensorrt_llm itself is replaced; torch and the rest stay as NVIDIA shipped them.
RUN python3 -m pip install --no-cache-dir --no-deps --force-reinstall /tmp/trtllm-wheel/tensorrt_llm-*.whl \
    && rm -rf /tmp/trtllm-wheel

# The stage name comes from the build argument: trtllm-guard-0 or trtllm-guard-1.
# hadolint ignore=DL3006
FROM trtllm-guard-${TRTLLM_SCHEDULER_GUARD} AS gpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/cache/huggingface \
    WHISPER_SERVE_CACHE=/cache/whisper-serve \
    XDG_CACHE_HOME=/cache/xdg
WORKDIR /opt/whisper-serve

# Dependencies first (changes rarely). Every distribution already in the container is pinned
# to its installed version through a constraints file, so pip can add what is missing but can
# never replace torch, tensorrt_llm or anything they depend on: a conflict fails the build
# here instead of breaking TensorRT-LLM at run time.
COPY pyproject.toml docker/list-dependencies.py ./
RUN python3 -m pip list --format=freeze > /tmp/container-constraints.txt \
    && python3 list-dependencies.py pyproject.toml --exclude torch > /tmp/requirements.txt \
    && python3 -m pip install --no-cache-dir -c /tmp/container-constraints.txt -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The project itself; --no-deps because the dependencies are in place.
COPY README.md ./
COPY whisper_engine ./whisper_engine
COPY server ./server
RUN python3 -m pip install --no-cache-dir --no-deps . \
    && python3 -c "import tensorrt_llm, whisper_engine, server; print('tensorrt_llm', tensorrt_llm.__version__)" \
    && rm -rf /tmp/container-constraints.txt build

RUN groupadd --system --gid 10001 whisper \
    && useradd --system --uid 10001 --gid whisper --create-home --home-dir /home/whisper whisper \
    && mkdir -p /cache/huggingface /cache/whisper-serve /cache/xdg \
    && chown -R whisper:whisper /cache
VOLUME ["/cache"]
# Numeric, so Kubernetes runAsNonRoot can verify it.
USER 10001:10001
EXPOSE 8000
# /ready answers 200 only once the engine is warmed up; model download and engine build can
# take minutes on first start, hence the long start period.
HEALTHCHECK --interval=15s --timeout=5s --start-period=900s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=4)"]
ENTRYPOINT ["whisper-server"]
CMD ["--host", "0.0.0.0", "--port", "8000", "--backend", "trtllm", "--model", "openai/whisper-large-v3"]

############################################################################################
# CPU: slim Python, CPU torch, the embedded default model converted at build time
############################################################################################
FROM ${PYTHON_IMAGE} AS cpu
ARG TORCH_VERSION
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/cache/huggingface \
    WHISPER_SERVE_CACHE=/cache/whisper-serve \
    XDG_CACHE_HOME=/cache/xdg
WORKDIR /opt/whisper-serve

# torch from PyTorch's CPU index (the default index would pull the CUDA build: GBs of
# libraries a CPU image never loads).
RUN python -m pip install "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml docker/list-dependencies.py ./
RUN python list-dependencies.py pyproject.toml --exclude torch > /tmp/requirements.txt \
    && python -m pip install "torch==${TORCH_VERSION}" -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY README.md ./
COPY whisper_engine ./whisper_engine
COPY server ./server
RUN python -m pip install --no-deps . && rm -rf build

RUN groupadd --system --gid 10001 whisper \
    && useradd --system --uid 10001 --gid whisper --create-home --home-dir /home/whisper whisper \
    && mkdir -p /cache/huggingface /cache/whisper-serve /cache/xdg \
    && chown -R whisper:whisper /cache
# Numeric, so Kubernetes runAsNonRoot can verify it.
USER 10001:10001
# Convert the embedded Whisper base into the cache now, so the container starts offline.
RUN python -c "from whisper_engine.checkpoints import resolve_checkpoint; print(resolve_checkpoint())"
VOLUME ["/cache"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=4)"]
ENTRYPOINT ["whisper-server"]
CMD ["--host", "0.0.0.0", "--port", "8000", "--backend", "torch"]
