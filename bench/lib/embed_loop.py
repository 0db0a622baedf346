"""The loop a user would write to embed a folder: one process, one session, one image at a time.

Read each file, decode it with the service's decoder (``service.imaging.images.Preprocessor``),
run the service's onnxruntime session (``service.runtime.backend.OnnxBackend``: the service's
providers, CUDA where a GPU is, else the CPU with its intra-op threads on every core) on batches
of 64, in turn. It writes nothing: it is the floor a batch
tool must beat, not a tool.

    python -m bench.lib.embed_loop MODEL FOLDER     # prints {"images", "seconds", "images_per_s"}

As a script (``bench/embed.py``'s "loop, whole script"), its wall time includes Python's start,
its imports and the session's load, as ``smso-embed``'s does; :func:`loop_rate` is the loop
alone, in the caller's process.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BATCH = 64  # images per session call


def loop_rate(model: Path, files: Sequence[Path], batch: int = BATCH) -> dict[str, Any]:
    """Images/s of the loop over ``files``, from the first read to the last batch's answer (the
    session's load not included)."""
    import numpy as np

    from service.imaging.images import Preprocessor
    from service.runtime.backend import BackendOptions, OnnxBackend

    backend = OnnxBackend(model, BackendOptions(providers="auto", max_batch=batch))
    preprocess = Preprocessor(backend.card.preprocessing, 50_000_000)
    start = time.perf_counter()
    for i in range(0, len(files), batch):
        chunk = files[i : i + batch]
        backend.run(np.stack([preprocess(path.read_bytes(), str(path)) for path in chunk]))
    seconds = time.perf_counter() - start
    return {"images": len(files), "seconds": seconds, "images_per_s": len(files) / seconds}


def main(argv: Sequence[str] | None = None) -> int:
    model, folder = (Path(arg) for arg in (argv or sys.argv[1:]))
    files = sorted(path for path in folder.iterdir() if path.is_file())
    print(json.dumps(loop_rate(model, files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
