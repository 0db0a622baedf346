# The GPU serving image: smso-serve on onnxruntime-gpu 1.31 (CUDA 13, cuDNN 9, and TensorRT 10
# for its TensorRT provider), serving dependencies only (no torch), as a non-root user.
#   docker compose build serve     (or: docker build -f docker/serve-gpu.Dockerfile -t smso-serve:gpu .)
#   docker run --rm --gpus all -p 8000:8000 smso-serve:gpu
# Ubuntu 24.04 on purpose: TensorRT's libraries mark their stack executable, which glibc >= 2.41
# refuses to load (Ubuntu 24.04 has 2.39). Settings: SMSO_* variables (docker/serve.env).
FROM nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# 1. Dependencies, from pyproject.toml alone, so that a code change does not reinstall them.
#    The TensorRT libraries land in /opt/venv/tensorrt_libs: the TensorRT provider finds them on
#    LD_LIBRARY_PATH (CUDA and cuDNN come from the base image; libcuda from the host's driver).
COPY pyproject.toml ./
COPY docker/requirements.py docker/tensorrt_spec.py docker/install-serving.sh docker/check-gpu-libs.sh docker/
ENV PATH=/opt/venv/bin:$PATH \
    LD_LIBRARY_PATH=/opt/venv/tensorrt_libs:$LD_LIBRARY_PATH
RUN bash docker/install-serving.sh /opt/venv --tensorrt && bash docker/check-gpu-libs.sh /opt/venv

# 2. The service and the card's maths it shares with export (no training code in a serving
#    image) and the model.
COPY README.md ./
COPY service service
COPY modelcard modelcard
COPY gallery gallery
RUN pip install --quiet --no-deps . && rm -rf build ./*.egg-info
COPY models models
COPY docker/healthcheck.py /usr/local/bin/smso-healthcheck

RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin smso \
    && mkdir -p /cache/tensorrt && chown smso /cache/tensorrt
USER smso
ENV SMSO_HOST=0.0.0.0 \
    SMSO_PORT=8000 \
    SMSO_MODEL_PATH=/app/models/fashion-mnist-smso/model.onnx \
    SMSO_ENGINE_CACHE_DIR=/cache/tensorrt
# 8000: HTTP; 8001: the Open Inference Protocol over gRPC (SMSO_GRPC_PORT)
EXPOSE 8000 8001
# start period: loading, TensorRT engine builds and warming up every batch size come first
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 CMD ["python3", "/usr/local/bin/smso-healthcheck"]
CMD ["smso-serve"]
