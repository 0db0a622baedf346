"""Inference on a batch of decoded images: one onnxruntime session, the service's answers.

:class:`Embedder` holds one onnxruntime session made by the service's
:class:`service.runtime.backend.OnnxBackend` (providers chosen by the service's rules: CUDA where
a GPU is, else the CPU) and scores typicality as the service does
(:func:`service.models.scoring.scored`). What it returns per image (a :func:`row_schema` table)
is what ``/embed`` and ``/classify`` answer for the same file: the embedding (L2-normalised as
:func:`service.dataplane.answers.l2_normalised` where asked), the top-k classes by
:func:`service.dataplane.answers.top_classes`, the typicality score and p-value; and what
:func:`batch.decoding.decode` said of the file (its error, size and time, the seconds each
stage took), with the seconds of inference.

The embedded engine calls it in its inference threads, the Ray engine in its actors.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from batch.decoding import NOT_FINITE, DecodeOptions, decode
from service.dataplane.answers import l2_normalised, top_classes
from service.models.scoring import scored, typicality_reference
from service.runtime.backend import BackendOptions, OnnxBackend

__all__ = ["EmbedOptions", "Embedder", "row_schema"]


@dataclass(frozen=True)
class EmbedOptions:
    """How each session runs and what it writes."""

    providers: str = "auto"  # onnxruntime providers: "auto" (CUDA where a GPU is) or a list
    threads: int = 0  # onnxruntime's intra-op threads per session; 0: its default
    batch_size: int = 256  # images per inference call (the largest bucket on a GPU)
    top_k: int = 5  # classes per image, best first
    normalize: bool = False  # L2-normalise each embedding (as /embed?normalize=true)


def row_schema(embedding_dim: int, top_k: int) -> pa.Schema:
    """What :class:`Embedder` returns per image: the service's answers, the error (null where
    there is none; every answer null where there is one), what the file was when read, and the
    seconds each stage took for it. :class:`batch.parts.PartWriter` keeps what OUT stores."""
    return pa.schema(
        [
            ("path", pa.string()),
            ("chunk", pa.int64()),  # the output part it belongs to (batch.parts.chunked)
            ("file_size", pa.int64()),  # -1: not read
            ("file_mtime_ns", pa.int64()),
            ("embedding", pa.list_(pa.float32(), embedding_dim)),
            ("top_k_indices", pa.list_(pa.int32(), top_k)),
            ("top_k_scores", pa.list_(pa.float32(), top_k)),
            ("typicality_score", pa.float64()),
            ("typicality_p_value", pa.float64()),
            ("error_kind", pa.string()),
            ("error", pa.string()),
            ("read_s", pa.float64()),
            ("decode_s", pa.float64()),
            ("infer_s", pa.float64()),
        ]
    )


def _fixed(values: np.ndarray, valid: np.ndarray, kind: pa.DataType) -> pa.Array:
    """``values`` (N, W) as a fixed-size list array, null where ``valid`` (N,) is False."""
    flat = pa.array(values.reshape(-1), type=kind)
    array = pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
    if valid.all():
        return array
    return pa.FixedSizeListArray.from_arrays(flat, values.shape[1], mask=pa.array(~valid))


class Embedder:
    """One onnxruntime session: decoded images in, the service's answers out.

    ``model`` is the ONNX file's bytes (:attr:`batch.model.ModelFile.data`: the same file on
    every node of a cluster). With ``decoding``, each call decodes its batch of paths first.
    """

    def __init__(
        self, model: bytes, options: EmbedOptions, decoding: DecodeOptions | None = None
    ) -> None:
        self.options = options
        self.decoding = decoding  # decode here too (batches of paths), or take decoded batches
        with tempfile.TemporaryDirectory(prefix="smso-embed-") as folder:
            path = Path(folder) / "model.onnx"  # onnxruntime reads the file once, here
            path.write_bytes(model)
            backend_options = BackendOptions(
                providers=options.providers, threads=options.threads, max_batch=options.batch_size
            )
            self.backend = OnnxBackend(path, backend_options)
        self.k = min(options.top_k, len(self.backend.card.classes))
        typicality = typicality_reference(self.backend, True, self.backend.card.name)
        self.run = scored(self.backend.run, typicality)
        self.schema = row_schema(self.backend.card.model.embedding_dim, self.k)

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        """A decoded batch (:func:`batch.decoding.decode`'s columns), or with ``decoding`` a
        batch of paths (``{"path": (N,), "chunk": (N,)}``) -> a :func:`row_schema` table."""
        if self.decoding is not None:
            batch = decode(batch, self.decoding)
        start = time.perf_counter()
        kinds = np.array([str(kind) for kind in batch["error_kind"]], dtype=object)
        errors = [str(error) for error in batch["error"]]
        ok = kinds == ""
        n, dim = len(kinds), self.schema.field("embedding").type.list_size
        embedding = np.zeros((n, dim), np.float32)
        indices = np.zeros((n, self.k), np.int32)
        top_scores = np.zeros((n, self.k), np.float32)
        typicality = np.full((n, 2), np.nan)
        if ok.any():
            images = np.ascontiguousarray(batch["image"][ok], dtype=np.float32)  # (M, C, S, S)
            outputs = self.run(images)
            logits, vectors = outputs.logits, outputs.embedding  # (M, K), (M, p)
            scores, order = top_classes(logits, self.k)  # (M, K), (M, k)
            vectors = l2_normalised(vectors) if self.options.normalize else vectors
            embedding[ok] = vectors
            indices[ok] = order
            top_scores[ok] = np.take_along_axis(scores, order, axis=-1)
            if outputs.typicality is not None and outputs.p_value is not None:
                typicality[ok] = np.stack([outputs.typicality, outputs.p_value], axis=-1)
            finite = np.isfinite(vectors).all(axis=-1) & np.isfinite(logits).all(axis=-1)
            for row in np.flatnonzero(ok)[~finite]:
                kinds[row] = NOT_FINITE
                errors[row] = (
                    f"{batch['path'][row]}: the model's outputs are NaN or infinite (the model "
                    "file is at fault, not the image)"
                )
            ok = kinds == ""
        scored_rows = ok & ~np.isnan(typicality[:, 0])
        infer_s = np.full(n, (time.perf_counter() - start) / max(n, 1))
        columns = [
            pa.array([str(path) for path in batch["path"]], pa.string()),
            pa.array(np.asarray(batch["chunk"], np.int64)),
            pa.array(np.asarray(batch["file_size"], np.int64)),
            pa.array(np.asarray(batch["file_mtime_ns"], np.int64)),
            _fixed(embedding, ok, pa.float32()),
            _fixed(indices, ok, pa.int32()),
            _fixed(top_scores, ok, pa.float32()),
            pa.array(typicality[:, 0], pa.float64(), mask=~scored_rows),
            pa.array(typicality[:, 1], pa.float64(), mask=~scored_rows),
            pa.array([kind or None for kind in kinds], pa.string()),
            pa.array([error or None for error in errors], pa.string()),
            pa.array(np.asarray(batch["read_s"], np.float64)),
            pa.array(np.asarray(batch["decode_s"], np.float64)),
            pa.array(infer_s),
        ]
        return pa.Table.from_arrays(columns, schema=self.schema)
