"""The work of a job, as Ray Data runs it: decoding in tasks, inference in a pool of actors.

:func:`decode` (a ``map_batches`` function, run in CPU tasks) reads each image's bytes from its
filesystem and turns them into the model's input with the service's own
:class:`service.imaging.images.Preprocessor`, under the service's limits (the file's size, the
pixel count and aspect ratio read from the header). A file that cannot be read or is refused
becomes a row with an error kind and message instead of an image: the job goes on.

:class:`Embedder` (a ``map_batches`` class: one per actor) holds one onnxruntime session made by
the service's :class:`service.runtime.backend.OnnxBackend` (providers chosen by the service's
rules: CUDA where the actor has a GPU, else the CPU) and scores typicality as the service does
(:func:`service.models.loader.scored`). What it returns per image (a :data:`ROW_SCHEMA` table)
is what ``/embed`` and ``/classify`` answer for the same file: the embedding (L2-normalised as
:func:`service.dataplane.pipeline.l2_normalised` where asked), the top-k classes by
:func:`service.dataplane.pipeline.top_classes`, the typicality score and p-value.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import ray

from batch.inputs import Location
from batch.walk import open_regular
from service.core.card import Preprocessing
from service.dataplane.pipeline import l2_normalised, top_classes
from service.imaging.images import ImageError, ImageTooLargeError, Preprocessor
from service.models.loader import scored, typicality_reference
from service.runtime.backend import BackendOptions, OnnxBackend

__all__ = [
    "DecodeOptions",
    "EmbedOptions",
    "Embedder",
    "decode",
    "row_schema",
]

#: The error kinds of the errors table: the service's codes for refused images (400, 413), and
#: the job's own for files it could not read or a model whose outputs are not finite.
UNREADABLE = "unreadable"  # the filesystem could not open or read the file
FILE_TOO_LARGE = "file_too_large"  # more bytes than the service accepts for one upload
IMAGE_TOO_LARGE = "image_too_large"  # more pixels than the service accepts (its 413)
INVALID_IMAGE = "invalid_image"  # not a decodable image of an accepted format (its 400)
NOT_FINITE = "output_not_finite"  # the model's outputs are NaN or infinite: the model's fault


@dataclass(frozen=True)
class DecodeOptions:
    """What :func:`decode` needs: where the files are and the service's limits."""

    location: Location  # the images' filesystem (paths in the batch are URIs on it)
    preprocessing: Preprocessing  # the model card's
    max_pixels: int  # width x height of one image (the service's max_pixels)
    max_bytes: int  # one encoded file (the service's max_upload_bytes)


def _check_size(size: int, uri: str, options: DecodeOptions) -> None:
    if size > options.max_bytes:
        raise _RefusedError(
            FILE_TOO_LARGE, f"{uri}: {size:,} bytes, more than the {options.max_bytes:,} accepted"
        )


def _read(options: DecodeOptions, uri: str) -> bytes:
    """The file's bytes: a local one only if it is a regular file (a FIFO named in a list would
    block the task for ever), refused where it is larger than the service accepts."""
    location = options.location
    path = location.path_of(uri)
    if location.scheme:
        with location.filesystem.open_input_file(path) as stream:
            _check_size(stream.size(), uri, options)
            return stream.read()
    with open_regular(path) as file:
        _check_size(os.fstat(file.fileno()).st_size, uri, options)
        return file.read()


class _RefusedError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def decode(batch: dict[str, np.ndarray], options: DecodeOptions) -> dict[str, np.ndarray]:
    """``{"path": (N,)}`` -> ``path`` (N,), ``image`` (N, C, S, S) float32 (zeros where the
    file failed), ``error_kind`` and ``error`` (N,) (``""`` where it did not)."""
    preprocess = Preprocessor(options.preprocessing, options.max_pixels)
    spec = options.preprocessing
    paths = [str(path) for path in batch["path"]]
    images = np.zeros((len(paths), len(spec.mean), spec.crop, spec.crop), np.float32)
    kinds, errors = [""] * len(paths), [""] * len(paths)
    for i, uri in enumerate(paths):
        try:
            images[i] = preprocess(_read(options, uri), uri)
        except _RefusedError as refused:
            kinds[i], errors[i] = refused.kind, str(refused)
        except ImageTooLargeError as error:
            kinds[i], errors[i] = IMAGE_TOO_LARGE, str(error)
        except ImageError as error:
            kinds[i], errors[i] = INVALID_IMAGE, str(error)
        except OSError as error:  # missing, not a regular file, permissions, the network
            # strerror, not str(error): the latter repeats the path, maybe not valid UTF-8
            kinds[i], errors[i] = UNREADABLE, f"{uri}: cannot be read ({error.strerror or error})"
        except MemoryError:
            kinds[i], errors[i] = IMAGE_TOO_LARGE, f"{uri}: out of memory while decoding"
    return {
        "path": np.array(paths, dtype=object),
        "image": images,
        "error_kind": np.array(kinds, dtype=object),
        "error": np.array(errors, dtype=object),
    }


@dataclass(frozen=True)
class EmbedOptions:
    """How each actor's session runs and what it writes."""

    providers: str = "auto"  # onnxruntime providers: "auto" (CUDA where a GPU is) or a list
    threads: int = 0  # onnxruntime's intra-op threads per actor; 0: its default
    batch_size: int = 256  # images per inference call (the largest bucket on a GPU)
    top_k: int = 5  # classes per image, best first
    normalize: bool = False  # L2-normalise each embedding (as /embed?normalize=true)


def row_schema(embedding_dim: int, top_k: int) -> pa.Schema:
    """What :class:`Embedder` returns per image: the service's answers, and the error (null
    where there is none; every other column null where there is one)."""
    return pa.schema(
        [
            ("path", pa.string()),
            ("embedding", pa.list_(pa.float32(), embedding_dim)),
            ("top_k_indices", pa.list_(pa.int32(), top_k)),
            ("top_k_scores", pa.list_(pa.float32(), top_k)),
            ("typicality_score", pa.float64()),
            ("typicality_p_value", pa.float64()),
            ("error_kind", pa.string()),
            ("error", pa.string()),
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
    """One actor's onnxruntime session: decoded images in, the service's answers out."""

    def __init__(
        self,
        model: list[ray.ObjectRef],
        options: EmbedOptions,
        decoding: DecodeOptions | None = None,
    ) -> None:
        data = ray.get(model[0])  # the file's bytes, put into the object store once by the driver
        self.options = options
        self.decoding = decoding  # decode here too (batches of paths), or take decoded batches
        with tempfile.TemporaryDirectory(prefix="smso-embed-") as folder:
            path = Path(folder) / "model.onnx"  # onnxruntime reads the file once, here
            path.write_bytes(data)
            backend_options = BackendOptions(
                providers=options.providers, threads=options.threads, max_batch=options.batch_size
            )
            self.backend = OnnxBackend(path, backend_options)
        self.k = min(options.top_k, len(self.backend.card.classes))
        typicality = typicality_reference(self.backend, True, self.backend.card.name)
        self.run = scored(self.backend.run, typicality)
        self.schema = row_schema(self.backend.card.model.embedding_dim, self.k)

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        """A decoded batch (:func:`decode`'s columns), or with ``decoding`` a batch of paths
        (``{"path": (N,)}``) -> a :func:`row_schema` table."""
        if self.decoding is not None:
            batch = decode(batch, self.decoding)
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
        columns = [
            pa.array([str(path) for path in batch["path"]], pa.string()),
            _fixed(embedding, ok, pa.float32()),
            _fixed(indices, ok, pa.int32()),
            _fixed(top_scores, ok, pa.float32()),
            pa.array(typicality[:, 0], pa.float64(), mask=~scored_rows),
            pa.array(typicality[:, 1], pa.float64(), mask=~scored_rows),
            pa.array([kind or None for kind in kinds], pa.string()),
            pa.array([error or None for error in errors], pa.string()),
        ]
        return pa.Table.from_arrays(columns, schema=self.schema)
