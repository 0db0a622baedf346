# Development image: the full environment (training, export, serving, tests) on the CPU, for
# `docker compose --profile test run --rm tests` (the test suite in a clean container).
# The images to deploy are serve-gpu, serve-cpu and train.Dockerfile (docs/deployment.md).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
# Dependencies first, so that a code change does not reinstall them.
COPY pyproject.toml README.md ./
RUN mkdir training export service modelcard \
    && touch training/__init__.py export/__init__.py service/__init__.py modelcard/__init__.py \
    && python -m pip install --no-cache-dir -e '.[dev]'
COPY . .
CMD ["python", "-m", "pytest"]
