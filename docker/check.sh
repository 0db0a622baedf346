#!/usr/bin/env bash
# `make docker-check` (CI runs it): the images' install steps and docker-compose.yml, checked
# without a Docker engine.
#  1. Each install script runs into a fresh virtual environment, the project goes in as the
#     Dockerfile puts it (the same folders, `pip install --no-deps`), and the result is smoke-tested:
#     serving (GPU flavour, then the CPU flavour, which also serves the shipped model and answers
#     the container health check) without torch; training with smso-train and smso-export.
#     Serving venvs use Python 3.12 (the images') where this machine has one; the training venv
#     uses 3.11 (torch's wheels on this disk) and its extras are resolved for 3.12 by pip --dry-run.
#  2. docker-compose.yml is validated by Debian's docker-compose (installed if missing), with
#     every profile, and each profile starts the services the docs say.
# DOCKER_CHECK_KEEP=1 keeps the temporary folder (its path is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

tmp=$(mktemp -d /tmp/docker-check.XXXXXX)
server=
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then kill "$server"; wait "$server" || true; fi
  if [ "${DOCKER_CHECK_KEEP:-0}" = 1 ]; then echo "docker-check: kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

step_start=$SECONDS
step() { echo "== docker-check: $* (at ${SECONDS}s)"; step_start=$SECONDS; }
done_step() { echo "   ok in $((SECONDS - step_start))s"; }
fail() { echo "docker-check: FAILED: $*" >&2; exit 1; }

# The build context of an image, as its Dockerfile copies it: pyproject.toml, README.md, packages.
context() {
  local dir=$tmp/context-$1
  shift
  mkdir -p "$dir"
  cp pyproject.toml README.md "$dir/"
  for package in "$@"; do cp -r "$package" "$dir/"; done
  find "$dir" -name __pycache__ -prune -exec rm -rf {} +
  echo "$dir"
}

# Install the project's own code into VENV without dependencies, as the Dockerfiles do.
install_project() {
  "$1/bin/python" -m pip install --quiet --no-deps "$2" || fail "pip install --no-deps of the source into $1"
}

# The serving images run Python 3.12 (Ubuntu 24.04's, python:3.12-slim): their venvs here are
# made with a 3.12 where this machine has one (pyenv's, or on PATH), so that a dependency without
# a wheel for it fails here too; else with python3, said in the log.
serving_python=python3
for candidate in python3.12 "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/3.12*/bin/python3.12; do
  if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    serving_python=$candidate
    break
  fi
done
echo "== docker-check: serving venvs with $serving_python ($("$serving_python" --version 2>&1))"

# Nothing below may import the source tree instead of the installed package.
cd "$tmp"

step "serving dependencies (GPU image: docker/install-serving.sh), fresh venv"
PYTHON=$serving_python bash "$root/docker/install-serving.sh" "$tmp/serve-gpu"
install_project "$tmp/serve-gpu" "$(cd "$root" && context serve service modelcard gallery)"
"$tmp/serve-gpu/bin/python" -c "import service.app, service.cli, onnxruntime" \
  || fail "the service does not import in the GPU serving venv"
"$tmp/serve-gpu/bin/smso-serve" --help >/dev/null || fail "smso-serve --help in the GPU serving venv"
# GPU JPEG decoding from the installed package (its graph is package data): here on
# nvImageCodec's CPU decoder and onnxruntime's CPU provider, the code the GPU runs
"$tmp/serve-gpu/bin/python" - <<'PY' || fail "GPU JPEG decoding (service.imaging.gpu_jpeg) does not run in the GPU serving venv"
from service.core.card import Preprocessing
from service.imaging.gpu_jpeg import GpuJpegPreprocessor
from service.imaging.images import Preprocessor

spec = Preprocessing(colour="RGB", resize=256, crop=224, mean=[0.5] * 3, std=[0.25] * 3)
GpuJpegPreprocessor(Preprocessor(spec, 10**7), "cpu")  # decodes and checks a probe JPEG
PY
if "$tmp/serve-gpu/bin/python" -c "import torch" 2>/dev/null; then
  fail "torch is importable in the serving venv: the serving extra must not pull it"
fi
spec=$("$tmp/serve-gpu/bin/python" "$root/docker/tensorrt_spec.py") \
  || fail "docker/tensorrt_spec.py cannot tell which TensorRT this onnxruntime-gpu needs"
[[ $spec =~ ^tensorrt-cu[0-9]+-libs\>=[0-9]+,\<[0-9]+$ ]] || fail "tensorrt_spec.py printed '$spec'"
echo "   the GPU image adds $spec (NVIDIA's index; not reachable from CI)"
done_step

step "serving dependencies (CPU image: docker/install-serving.sh --cpu), fresh venv, a real server"
PYTHON=$serving_python bash "$root/docker/install-serving.sh" "$tmp/serve-cpu" --cpu
install_project "$tmp/serve-cpu" "$tmp/context-serve"
"$tmp/serve-cpu/bin/python" - <<'PY' || fail "the CPU serving venv holds the wrong packages"
import importlib.metadata as md, importlib.util
names = {d.metadata["Name"].lower() for d in md.distributions()}
assert "onnxruntime" in names and "onnxruntime-gpu" not in names, sorted(names)
assert importlib.util.find_spec("torch") is None, "torch is importable"
import service.app  # noqa: F401
PY
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
export SMSO_PORT=$port
export SMSO_GRPC_PORT=$(free_port)  # gRPC too, on a port of its own (8001 may be taken here)
if python3 "$root/docker/healthcheck.py" 2>/dev/null; then
  fail "docker/healthcheck.py passed with no server on port $port"
fi
SMSO_HOST=127.0.0.1 SMSO_MODEL_PATH=$root/models/fashion-mnist-smso/model.onnx SMSO_LOG_LEVEL=warning \
  "$tmp/serve-cpu/bin/smso-serve" &
server=$!
for _ in $(seq 120); do
  if python3 "$root/docker/healthcheck.py" 2>/dev/null; then break; fi
  kill -0 "$server" 2>/dev/null || fail "smso-serve exited before it was ready"
  sleep 0.5
done
python3 "$root/docker/healthcheck.py" || fail "smso-serve not ready on port $port after 60 s"
python3 - "$port" <<'PY' || fail "/metrics does not answer Prometheus text"
import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5) as r:
    assert "# TYPE" in r.read().decode(), "no metric families"
PY
kill -TERM "$server"
status=0
wait "$server" || status=$?
server=
[ "$status" = 0 ] || fail "smso-serve stopped with status $status on SIGTERM"
unset SMSO_PORT SMSO_GRPC_PORT
echo "   served the shipped model; /readyz (docker/healthcheck.py) and /metrics answered; SIGTERM: status $status"
done_step

step "training dependencies (docker/install-training.sh), fresh venv"
bash "$root/docker/install-training.sh" "$tmp/train"
train_context=$(cd "$root" && context train training export modelcard)
install_project "$tmp/train" "$train_context"
"$tmp/train/bin/smso-train" --help >/dev/null || fail "smso-train --help in the training venv"
"$tmp/train/bin/smso-export" --help >/dev/null || fail "smso-export --help in the training venv"
"$tmp/train/bin/python" -c "
import torch, torchvision, onnx, onnxruntime
assert torch.__version__.split('+')[0] == '2.14.1', torch.__version__
assert torchvision.__version__.split('+')[0] == '0.29.1', torchvision.__version__
" || fail "the training venv has the wrong torch or torchvision"
if [ "$serving_python" != python3 ]; then
  # The training image runs Python 3.12 too; its torch wheels are not on this disk (3.11's are),
  # so check that pip resolves every wheel of the extras for 3.12 without downloading them.
  mapfile -t train_reqs < <("$serving_python" "$root/docker/requirements.py" training export)
  "$serving_python" -m pip install --dry-run --ignore-installed --only-binary=:all: --quiet \
    --report "$tmp/train-312.json" "${train_reqs[@]}" \
    || fail "the training extras do not resolve to wheels for Python 3.12 (the training image's)"
  echo "   resolved for the image's Python 3.12 too (pip --dry-run)"
fi
done_step

step "docker-compose.yml with Debian's docker-compose"
cd "$root"
if ! command -v docker-compose >/dev/null; then
  sudo=
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get install -y -q docker-compose >/dev/null \
    || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q docker-compose >/dev/null; } \
    || fail "could not install Debian's docker-compose"
fi
docker-compose version --short
compose() { env -u SMSO_API_KEY -u SMSO_REPLICAS docker-compose -f docker-compose.yml "$@"; }
compose config -q || fail "docker-compose rejects docker-compose.yml"
for profile in cpu scale train test; do
  compose --profile "$profile" config -q || fail "docker-compose --profile $profile rejects docker-compose.yml"
done
profiles=$(compose config --profiles | tr '\n' ' ')
[ "$profiles" = "cpu scale test train " ] || fail "profiles are '$profiles', expected cpu scale test train"
# 1.29's `config` prints every service whatever the profile: check the resolved file instead.
# Debian's docker-compose runs on /usr/bin/python3, which therefore has PyYAML.
compose config >"$tmp/compose.yml"
/usr/bin/python3 - "$tmp/compose.yml" docker/nginx.conf <<'PY' || fail "docker-compose.yml does not match docs/deployment.md"
import re, sys, yaml

services = yaml.safe_load(open(sys.argv[1]))["services"]
profiles = {name: s.get("profiles", []) for name, s in services.items()}
expected = {"serve": [], "serve-cpu": ["cpu"], "replica": ["scale"], "lb": ["scale"],
            "train": ["train"], "tests": ["test"]}
assert profiles == expected, f"profiles {profiles}, expected {expected}"

def gpus(s):
    devices = s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return [d for d in devices if d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])]

for name in ("serve", "replica", "train"):
    assert gpus(services[name]), f"{name} reserves no NVIDIA GPU"
assert not gpus(services["serve-cpu"]), "serve-cpu reserves a GPU"
for name in ("serve", "serve-cpu", "replica"):
    s = services[name]
    env = s["environment"]
    assert env.get("SMSO_HOST") == "0.0.0.0", f"{name}: SMSO_HOST is {env.get('SMSO_HOST')}"
    assert env.get("SMSO_MODEL_PATH", "").startswith("/app/models/"), f"{name}: SMSO_MODEL_PATH"
    assert "SMSO_API_KEY" in env and env["SMSO_API_KEY"] is None, f"{name}: SMSO_API_KEY has a value"
    assert any(str(v).endswith(":/app/models:ro") for v in s.get("volumes", [])), f"{name}: models"
    assert "healthcheck" in s and s.get("restart") == "unless-stopped", f"{name}: health, restart"
assert "ports" not in services["replica"], "the replicas publish a host port"
assert services["replica"]["deploy"]["replicas"] >= 2, "fewer than 2 replicas"
upstream = re.findall(r"^\s*server\s+([\w.-]+):(\d+)", open(sys.argv[2]).read(), re.M)
assert upstream == [("replica", "8000")], f"nginx.conf's upstream is {upstream}, not replica:8000"
PY
echo "   config -q with no profile and each of: $profiles; services, GPUs, ports, env as documented"
done_step

echo "== docker-check: all passed in ${SECONDS}s"
