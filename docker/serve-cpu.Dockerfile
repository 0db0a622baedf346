# The CPU serving image: smso-serve on onnxruntime (CPU provider) on a slim Python base, serving
# dependencies only (no torch, no CUDA), as a non-root user. For hosts without an NVIDIA GPU.
#   docker compose --profile cpu build serve-cpu   (or: docker build -f docker/serve-cpu.Dockerfile -t smso-serve:cpu .)
#   docker run --rm -p 8000:8000 smso-serve:cpu
# Settings: SMSO_* variables (docker/serve.env).
FROM python:3.12-slim

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

WORKDIR /app
# 1. Dependencies, from pyproject.toml alone, so that a code change does not reinstall them.
#    --cpu: onnxruntime in place of onnxruntime-gpu, same version range.
COPY pyproject.toml ./
COPY docker/requirements.py docker/install-serving.sh docker/
ENV PATH=/opt/venv/bin:$PATH
RUN bash docker/install-serving.sh /opt/venv --cpu

# 2. The service and the card's maths it shares with export (no training code in a serving
#    image) and the model.
COPY README.md ./
COPY service service
COPY modelcard modelcard
COPY gallery gallery
RUN pip install --quiet --no-deps . && rm -rf build ./*.egg-info
COPY models models
COPY docker/healthcheck.py /usr/local/bin/smso-healthcheck

RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin smso
USER smso
ENV SMSO_HOST=0.0.0.0 \
    SMSO_PORT=8000 \
    SMSO_MODEL_PATH=/app/models/fashion-mnist-smso/model.onnx
# 8000: HTTP; 8001: the Open Inference Protocol over gRPC (SMSO_GRPC_PORT)
EXPOSE 8000 8001
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 CMD ["python3", "/usr/local/bin/smso-healthcheck"]
CMD ["smso-serve"]
