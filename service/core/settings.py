"""Service settings: environment variables with the prefix ``SMSO_`` (or flags of smso-serve),
validated once at start-up and passed into ``create_app(settings)``."""

from __future__ import annotations

import difflib
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.core.cpus import usable_cores

__all__ = ["DEFAULT_MODEL", "OTHER_VARIABLES", "Settings", "unknown_variables"]

#: The model this repository ships (written by ``make onnx`` from the shipped checkpoint).
DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "models" / "fashion-mnist-smso" / "model.onnx"


def _default_cache() -> Path:
    """``$XDG_CACHE_HOME/smso/tensorrt`` or ``~/.cache/smso/tensorrt``; a user without a home
    (a container's system user) gets one under the temporary folder."""
    try:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    except RuntimeError:  # Path.home(): no HOME and no passwd entry
        base = Path(tempfile.gettempdir())
    return base / "smso" / "tensorrt"


class Settings(BaseSettings):
    """Every knob of the service; each field is also ``SMSO_<NAME>`` in the environment."""

    # inf and nan are refused everywhere: no bound or deadline means "infinite" here
    model_config = SettingsConfigDict(
        env_prefix="SMSO_", env_file=None, extra="forbid", allow_inf_nan=False
    )

    model_path: Path = Field(DEFAULT_MODEL, description="ONNX file written by smso-export")
    model_repository: Path | None = Field(
        None,
        description="a folder of models in Triton's layout, <name>/<version>/model.onnx (the "
        "highest version of each is served under the folder's name); when set, model_path is "
        "not used",
    )
    model_control: Literal["poll", "explicit"] = Field(
        "poll",
        description="with a repository: 'poll' follows the folder (new models and versions "
        "loaded, removed ones unloaded); 'explicit': the models found at start-up are loaded, "
        "then only /v2/repository/models/<name>/load and /unload load and unload",
    )
    repository_poll_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="with model_control 'poll': seconds between scans of the repository folder "
        "and of the galleries (a new gallery generation is served at the next scan)",
    )
    gallery_path: Path | None = Field(
        None,
        description="a gallery folder written by smso-index from this model's smso-embed "
        "output (flag --gallery too), searched by /search; refused, and the model served "
        "without it, when it was built with another model or is damaged. In a repository each "
        "version's gallery is the folder gallery/ beside its model.onnx instead",
    )
    load_timeout_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="deadline of loading a model and warming it up (its first runs); beyond: "
        "the model is unavailable with that reason, and the others load and serve (raise it "
        "where TensorRT builds the engines of a large model)",
    )
    default_model: str | None = Field(
        None,
        description="the model /classify, /embed and /metadata serve when a repository holds "
        "several (unset: the only one)",
    )
    providers: str = Field(
        "auto",
        description="'auto' (TensorRT or CUDA where really usable, else CPU) or a comma-separated "
        "list of onnxruntime execution providers, e.g. "
        "'CUDAExecutionProvider,CPUExecutionProvider'",
    )
    max_batch_size: int = Field(16, ge=1, le=1024, description="images per onnxruntime call")
    max_wait_ms: float = Field(
        4.0,
        ge=0,
        le=10_000,
        description="wait to fill a batch, only while images of requests being decoded are on "
        "their way (and for those up to batch_patience times the last batch's inference time)",
    )
    batch_patience: float = Field(
        0.25,
        ge=0,
        le=10,
        description="how long, as a fraction of the last batch's inference time, a batch waits "
        "for images being decoded (at least max_wait_ms; 0: max_wait_ms only)",
    )
    batches_in_flight: int = Field(
        1,
        ge=1,
        le=8,
        description="batches dispatched to the inference thread before the last one's results "
        "are back (2: the next batch starts the moment the thread is free)",
    )
    queue_size: int = Field(256, ge=1, description="images waiting for inference; beyond: 503")
    typicality: bool = Field(
        True,
        description="score every image's typicality (and watch drift) where the model's card "
        "has a typicality reference; off: neither",
    )
    drift_window: int = Field(
        200,
        ge=20,
        le=100_000,
        description="images in the drift window: the test counts those with a typicality "
        "p-value below 0.01 among the last this many",
    )
    drift_alarm_p: float = Field(
        1e-7,
        gt=0,
        lt=1,
        description="drift alarm (metric smso_drift_alarm, a warning in the log) while the "
        "window's binomial p-value is below this",
    )
    max_inflight: int = Field(
        0,
        ge=0,
        description="images admitted for decoding at once (being decoded or waiting for a "
        "decode thread); beyond: 503 at once; 0: queue_size",
    )
    request_timeout_s: float = Field(
        30.0, gt=0, le=86_400, description="deadline of a request; beyond: 504"
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="a connection that has not sent a request's headers this long after it "
        "opened or the request began is closed (its body gets request_timeout_s)",
    )
    keep_alive_s: int = Field(
        5, ge=1, le=3600, description="an idle keep-alive connection is closed"
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="requests in progress, HTTP and gRPC together (health checks and scrapes "
        "not counted); beyond: 503 at once (gRPC: RESOURCE_EXHAUSTED)",
    )
    max_upload_bytes: int = Field(20 * 2**20, ge=1024, description="one image file, encoded")
    max_request_bytes: int = Field(64 * 2**20, ge=1024, description="one request body")
    max_buffered_bytes: int = Field(
        256 * 2**20,
        ge=1024,
        description="request bodies held in memory at once, over all requests in progress "
        "(at least max_request_bytes); beyond: 503 at once",
    )
    max_pixels: int = Field(50_000_000, ge=1, description="width x height of one image")
    max_files: int = Field(64, ge=1, description="images in one request")
    max_json_bytes: int = Field(
        4 * 2**20,
        ge=1024,
        description="the JSON part of an Open Inference Protocol request (parsing JSON holds the "
        "interpreter); larger tensors go as binary data",
    )
    workers: int | Literal["auto"] = Field(
        "auto",
        description="server processes, each with its own model session, batcher and decode "
        "threads, sharing the port (and the GPU): HTTP, JSON and decoding on more cores. "
        "auto: on the CPU one per usable core (the process's CPU affinity and its cgroup's "
        "CPU limit), at most max_auto_workers; on a GPU one process owning it",
    )
    max_auto_workers: int = Field(
        8,
        ge=1,
        le=64,
        description="with workers=auto, at most this many processes: each holds its own "
        "interpreter and model session (the weights and onnxruntime's buffers): about 70 "
        "MiB with the shipped model, 320 MiB with ResNet-18 at 224 px (docs/deployment.md)",
    )
    shared_session: bool = Field(
        False,
        description="with workers > 1: one process owns the model's session (and the GPU) and "
        "runs every worker's batches, merged when they arrive together, instead of a session "
        "and a CUDA context per worker taking turns on the GPU; the workers do HTTP, decoding "
        "and batching. One model file (model_path), not a repository",
    )
    decode_threads: int = Field(
        0,
        ge=0,
        le=256,
        description="threads decoding images, per worker; 0: half the usable CPU cores over "
        "the workers, at least 1 (more threads than that contend with onnxruntime and the "
        "event loop)",
    )
    decode_device: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="cuda: decode common JPEGs on the GPU (nvImageCodec) and resize them there "
        "(onnxruntime's CUDA provider), within a grey level or two of Pillow's; other images, "
        "and every image with cpu, are decoded by Pillow on the decode threads. Needs "
        "smso[gpu-decode]",
    )
    intra_op_threads: int = Field(
        0,
        ge=0,
        description="onnxruntime's threads per session; 0: with several workers each with its "
        "own session, the usable cores over the workers (workers x threads never exceeds the "
        "cores), else onnxruntime's default (one per core)",
    )
    intra_op_spinning: bool = Field(
        False,
        description="let onnxruntime's threads busy-wait between operators (lower latency on "
        "a dedicated machine; off: they leave the cores to decoding and HTTP)",
    )
    engine_cache_dir: Path | None = Field(
        None,
        description="TensorRT: folder for its engines and timing cache (a volume in a container), "
        "so a restart loads engines instead of building them; unset: ~/.cache/smso/tensorrt",
    )
    trt_fp16: bool = Field(False, description="TensorRT: allow float16 kernels")
    io_binding: bool = Field(
        False,
        description="CUDA: run through IO binding with device buffers per batch-size bucket",
    )
    cuda_graphs: bool = Field(
        False,
        description="CUDA: capture one CUDA graph per batch-size bucket (implies io_binding)",
    )
    api_key: SecretStr | None = Field(
        None,
        description="required on the model routes: /classify, /embed, /search, /metadata, "
        "/v1/embeddings and the Open Inference Protocol's /v2/models/... (health checks and "
        "/metrics stay open)",
    )
    docs_public: bool = Field(
        False,
        description="serve the API docs (/docs, /redoc, /openapi.json, and / redirecting to "
        "/docs) even when api_key is set (without a key they are always served; with one and "
        "this off they are 404)",
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    grpc_port: int = Field(
        8001,
        ge=0,
        le=65535,
        description="the Open Inference Protocol over gRPC (Triton's port), in the same process "
        "and on the same batchers as HTTP; with several workers they share it (SO_REUSEPORT); "
        "0: no gRPC",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = Field(
        "text",
        description="'text': one readable line per log record; 'json': one JSON object per line "
        "(time, level, logger, message, request_id, the access line's fields)",
    )

    @field_validator("model_repository")
    @classmethod
    def _repository_exists(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_dir():
            raise ValueError(
                f"model repository {path} is not a folder; give a folder of "
                "<name>/<version>/model.onnx (SMSO_MODEL_REPOSITORY or --model-repository)"
            )
        return path

    @field_validator("gallery_path")
    @classmethod
    def _gallery_is_a_folder(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_dir():
            problem = "is a file, not a folder" if path.exists() else "does not exist"
            raise ValueError(
                f"gallery {path} {problem}; give the folder smso-index wrote "
                "(smso-index OUT -o GALLERY; SMSO_GALLERY_PATH or --gallery)"
            )
        return path

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        """Settings that only make sense together: a request with more images than the queue
        holds could never be admitted, and would get 503 with Retry-After forever; a model file
        that does not exist (unless a repository is served instead)."""
        if self.model_repository is None and not self.model_path.is_file():
            problem = "is a folder, not a file" if self.model_path.is_dir() else "does not exist"
            raise ValueError(
                f"model file {self.model_path} {problem}; give an ONNX file written by "
                "smso-export (SMSO_MODEL_PATH or --model-path; a folder of models is "
                "--model-repository), or run `make onnx` for the shipped one"
            )
        if self.gallery_path is not None and self.model_repository is not None:
            raise ValueError(
                "gallery_path is the gallery of one model file (model_path), not of a "
                "repository: put each version's gallery in a folder gallery/ beside its "
                "model.onnx (<name>/<version>/gallery), and unset gallery_path"
            )
        if self.shared_session and self.model_repository is not None:
            raise ValueError(
                "shared_session serves one model file (model_path), not a model repository: "
                "unset shared_session, or serve one model with --model-path"
            )
        if self.grpc_port and self.grpc_port == self.port:
            raise ValueError(
                f"grpc_port and port are both {self.port}: gRPC needs a port of its own; "
                "give another (SMSO_GRPC_PORT or --grpc-port) or 0 to turn gRPC off"
            )
        if self.max_files > self.queue_size:
            raise ValueError(
                f"max_files ({self.max_files}) is larger than queue_size ({self.queue_size}): "
                "a request with that many images could never be queued; raise queue_size or "
                "lower max_files"
            )
        if self.max_request_bytes > self.max_buffered_bytes:
            raise ValueError(
                f"max_request_bytes ({self.max_request_bytes}) is larger than "
                f"max_buffered_bytes ({self.max_buffered_bytes}): a request that large could "
                "never be read; raise max_buffered_bytes or lower max_request_bytes"
            )
        if self.max_files > self.inflight_limit:
            raise ValueError(
                f"max_files ({self.max_files}) is larger than max_inflight "
                f"({self.max_inflight}): a request with that many images could never be "
                "admitted; raise max_inflight or lower max_files"
            )
        return self

    @property
    def inflight_limit(self) -> int:
        """``max_inflight``, with 0 resolved to ``queue_size``."""
        return self.max_inflight or self.queue_size

    def worker_processes(self, gpu: bool) -> int:
        """``workers``, with ``auto`` resolved: on a GPU (``gpu``: the providers run there) one
        process owning it; on the CPU one per usable core (:func:`usable_cores`), at most
        ``max_auto_workers``."""
        if self.workers != "auto":
            return self.workers
        return 1 if gpu else min(usable_cores(), self.max_auto_workers)

    @property
    def decode_workers(self) -> int:
        """``decode_threads``, with 0 resolved to half the usable cores shared among the worker
        processes (at least 1; ``auto`` not yet resolved counts as this one process)."""
        processes = self.workers if isinstance(self.workers, int) else 1
        return self.decode_threads or max(1, usable_cores() // 2 // processes)

    @property
    def session_threads(self) -> int:
        """``intra_op_threads``, with 0 resolved: with ``workers`` > 1 processes each holding a
        session, ``max(1, usable_cores // workers)``, so that workers x threads <= cores (more
        put busy threads on a core that another session's threads need); otherwise 0,
        onnxruntime's default (one thread per core) for the one session."""
        if self.intra_op_threads or self.shared_session:
            return self.intra_op_threads
        if not isinstance(self.workers, int) or self.workers == 1:
            return 0
        return max(1, usable_cores() // self.workers)

    @property
    def engine_cache(self) -> Path:
        """``engine_cache_dir``, or the default: ``$XDG_CACHE_HOME/smso/tensorrt``."""
        return self.engine_cache_dir or _default_cache()

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: object) -> int | str:
        """A whole number from 1 to 64, or ``auto`` (one message for both, where pydantic
        would give one per member of the union)."""
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        try:
            number = int(str(value).strip()) if not isinstance(value, bool) else None
        except ValueError:
            number = None
        if number is None or not 1 <= number <= 64:
            raise ValueError("workers is a whole number of processes from 1 to 64, or auto")
        return number

    @field_validator("api_key")
    @classmethod
    def _key_not_blank(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and not key.get_secret_value().strip():
            raise ValueError("api_key is empty; unset it to run without authentication")
        return key


#: ``SMSO_`` variables that are no setting but that other parts of the project read:
#: docker-compose's (published ports, replicas, user, datasets, training arguments), the
#: container's health check, the benches' and the tests'.
OTHER_VARIABLES = frozenset(
    {
        "SMSO_PUBLISH_PORT",
        "SMSO_PUBLISH_GRPC_PORT",
        "SMSO_REPLICAS",
        "SMSO_LB_PORT",
        "SMSO_UID",
        "SMSO_GID",
        "SMSO_DATASETS",
        "SMSO_TRAIN_ARGS",
        "SMSO_HEALTH_TIMEOUT",
        "SMSO_BENCH_MPS",
        "SMSO_BENCH_SWITCH_INTERVAL_MS",
        "SMSO_FUZZ_SCALE",
    }
)

#: Kubernetes' service links for a Service named ``smso`` (``SMSO_SERVICE_HOST``,
#: ``SMSO_PORT_8000_TCP_ADDR``...), in every pod of its namespace unless ``enableServiceLinks``
#: is off. (Its ``SMSO_PORT=tcp://...`` is overridden by the manifests' own ``SMSO_PORT``.)
_SERVICE_LINK = re.compile(
    r"SMSO_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT_\d+_(TCP|UDP|SCTP)(_\w+)?)"
)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A message for each ``SMSO_`` variable of ``environ`` that no setting reads (the names
    are matched as pydantic-settings matches them, ignoring case), naming the closest setting's
    variable: a misspelt setting would otherwise be ignored without a word."""
    settings = [name.upper() for name in Settings.model_fields]
    messages = []
    for variable in sorted(environ):
        name = variable.upper()
        if not name.startswith("SMSO_") or name[5:] in settings or name in OTHER_VARIABLES:
            continue
        if _SERVICE_LINK.fullmatch(name):
            continue
        # compared without the prefix, which every name shares
        close = difflib.get_close_matches(name[5:], settings, n=1, cutoff=0.6)
        hint = f"; did you mean SMSO_{close[0]}?" if close else ""
        messages.append(
            f"{variable} is not a setting of smso-serve and is ignored{hint} (the settings: "
            "smso-serve --help)"
        )
    return messages
