# The training image: smso-train and smso-export with PyTorch 2.14.1 (CUDA 13 wheels) on the GPU.
#   docker compose --profile train run --rm train     (datasets, configs and runs/ mounted)
#   docker build -f docker/train.Dockerfile -t smso-train .
# The CUDA `base` flavour is enough: PyPI's torch wheels bring their own cuDNN, cuBLAS and NCCL,
# and a runtime image would carry a second copy; the host's driver comes in at run time.
FROM nvidia/cuda:13.0.2-base-ubuntu24.04

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
COPY pyproject.toml ./
COPY docker/requirements.py docker/install-training.sh docker/
ENV PATH=/opt/venv/bin:$PATH
RUN bash docker/install-training.sh /opt/venv

# 2. The training and export code, the recipes, and the train-then-export command.
COPY README.md ./
COPY training training
COPY export export
# the model card's typicality maths, which the exporter writes (numpy only; not the service)
COPY modelcard modelcard
RUN pip install --quiet --no-deps . && rm -rf build ./*.egg-info
COPY configs configs
COPY docker/train.sh docker/train.sh

# Any user may run it (compose passes SMSO_UID:SMSO_GID so that runs/ stays yours): HOME and
# caches in /tmp, which every user can write.
ENV HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
CMD ["bash", "docker/train.sh"]
