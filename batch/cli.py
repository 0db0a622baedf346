"""``smso-embed MODEL INPUT -o OUT``: embed a whole collection of images on Ray Data.

Exit status: 0 when every image of INPUT is in OUT once (embedded, or refused by the service's
rules and written to the errors table); 1 for a fault of the job (an image lost or repeated, a
model whose outputs are not finite, a Ray failure); 2 for a mistake in the command (MODEL,
INPUT or OUT unusable, said in one line); 130 when stopped (Ctrl-C): what was written is kept,
and the same command with ``--resume`` finishes the job.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Sequence

import ray

from batch.embedder import EmbedOptions
from batch.inputs import InputError, locate, resolve, utf8_path
from batch.job import (
    JobOptions,
    JobResult,
    ResourceError,
    Resources,
    connect,
    default_resources,
    run_job,
)
from batch.lock import hold
from batch.model import ModelError, load_model_file
from batch.outputs import JobManifest, OutputError, prepare, scan
from batch.summary import Summary

__all__ = ["main", "parser"]

log = logging.getLogger("batch")

EPILOG = """\
INPUT is a folder (its images, recursively), a glob ('photos/**/*.jpg', quoted), or a .parquet
or .csv file with a column of paths or URIs (--column). OUT gets two Parquet datasets:
OUT/embeddings (path, embedding, top-k labels and scores, typicality, model name, version and
card checksum) and OUT/errors (path, kind, message). Runs on a local Ray started for the job,
or on a cluster: --address or RAY_ADDRESS. See docs/batch.md.
"""

#: The service's default limits (service.core.settings: max_pixels, max_upload_bytes).
MAX_PIXELS = 50_000_000
MAX_BYTES = 20 * 2**20


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: give a positive whole number")
    return value


def _share(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: give a number above 0")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="smso-embed",
        description="Run an exported SMSO model over a collection of images, on Ray Data, into "
        "Parquet: the same embeddings as the service's /embed.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL", help="the .onnx file smso-export wrote (or a URI)")
    p.add_argument("input", metavar="INPUT", help="a folder, a glob, or a .parquet/.csv list")
    p.add_argument("-o", "--out", required=True, metavar="OUT", help="the output folder (or URI)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the job in OUT: images already there are skipped (OUT may not exist yet)",
    )
    p.add_argument(
        "--address",
        help="a Ray cluster to run on, or auto for the one `ray start` ran here "
        "(default: RAY_ADDRESS, else a local Ray started for the job)",
    )
    p.add_argument(
        "--normalize", action="store_true", help="L2-normalise each embedding (as /embed does)"
    )
    p.add_argument("--top-k", type=_positive, default=5, help="classes per image (default 5)")
    p.add_argument("--column", default="path", help="the list's column of paths (default path)")
    p.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="in a folder or glob, follow symbolic links leading outside INPUT too (each folder "
        "is walked once: loops end); by default they are skipped and counted",
    )
    tuning = p.add_argument_group("how the work is spread (defaults suit the machine or cluster)")
    tuning.add_argument(
        "--batch-size", type=_positive, default=256, help="images per inference call (256)"
    )
    tuning.add_argument("--actors", type=_positive, help="inference actors (sessions)")
    tuning.add_argument("--actor-cpus", type=_share, help="Ray CPUs each actor holds")
    tuning.add_argument(
        "--gpus-per-actor", type=_share, help="Ray GPUs each actor holds (CUDA provider)"
    )
    tuning.add_argument(
        "--threads", type=int, default=None, help="onnxruntime threads per actor (0: all cores)"
    )
    tuning.add_argument("--decode-cpus", type=_share, help="Ray CPUs per decode task (0.5)")
    tuning.add_argument(
        "--decode-in-actors",
        action="store_true",
        help="each actor decodes its own images (no decode tasks; slower on 2 cores)",
    )
    tuning.add_argument(
        "--decode-batch", type=_positive, default=1024, help="images per decode task (1024)"
    )
    tuning.add_argument(
        "--rows-per-file", type=_positive, default=8192, help="images per output file (8192)"
    )
    tuning.add_argument("--cpus", type=_positive, help="CPUs of the local Ray (default: all)")
    tuning.add_argument(
        "--providers", default="auto", help="onnxruntime providers (auto: CUDA where a GPU is)"
    )
    limits = p.add_argument_group("the service's limits")
    limits.add_argument("--max-pixels", type=_positive, default=MAX_PIXELS)
    limits.add_argument("--max-bytes", type=_positive, default=MAX_BYTES)
    p.add_argument("--no-progress", action="store_true", help="no progress line")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="log what Ray and the job say")
    return p


def _resources(args: argparse.Namespace) -> Resources | None:
    """The flags' resources, the others by default (``None`` where no flag was given)."""
    given = (args.actors, args.actor_cpus, args.gpus_per_actor, args.threads, args.decode_cpus)
    if all(value is None for value in given) and not args.decode_in_actors:
        return None
    cluster = ray.cluster_resources()
    base = default_resources(cluster.get("CPU", 1.0), cluster.get("GPU", 0.0), args.actors)
    gpus = args.gpus_per_actor if args.gpus_per_actor is not None else base.actor_gpus
    return Resources(
        args.actors or base.actors,
        args.actor_cpus if args.actor_cpus is not None else base.actor_cpus,
        gpus,
        args.threads if args.threads is not None else base.threads,
        args.decode_cpus if args.decode_cpus is not None else base.decode_cpus,
        base.write_cpus,
        args.decode_in_actors,
    )


def _fail(message: str, status: int = 2) -> int:
    print(f"smso-embed: {message}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    with contextlib.ExitStack() as held:  # OUT's lock, from before prepare to the last scan
        return _run(args, held)


def _run(args: argparse.Namespace, held: contextlib.ExitStack) -> int:
    try:
        model = load_model_file(args.model)
        inputs = resolve(args.input, args.column, args.follow_symlinks)
        utf8_path(args.out)
        out = locate(args.out)
        top_k = min(args.top_k, len(model.card.classes))
        manifest = JobManifest(
            model.name,
            model.version,
            model.card_sha256,
            model.card.model.embedding_dim,
            top_k,
            args.normalize,
            model_sha256=model.sha256,
            model_file=model.source,
        )
        held.enter_context(hold(out))
        prepare(out, manifest, args.resume)
        before = scan(out)
    except (ModelError, InputError, OutputError) as error:
        return _fail(str(error))
    except OSError as error:
        return _fail(f"{args.out}: {error}")
    todo = [uri for uri in inputs.uris if uri not in before.done]
    embed = EmbedOptions(args.providers, args.threads or 0, args.batch_size, top_k, args.normalize)
    try:
        if todo:
            with connect(args.address, args.cpus) as ray_start:
                options = JobOptions(
                    embed,
                    _resources(args),
                    decode_batch=args.decode_batch,
                    rows_per_file=args.rows_per_file,
                    max_pixels=args.max_pixels,
                    max_bytes=args.max_bytes,
                    progress=not args.no_progress and not args.json,
                )
                result = run_job(model, inputs.location, todo, out, options)
        else:  # nothing to do: no Ray to start
            ray_start, result = 0.0, JobResult(0, 0, {}, 0.0, None)
    except ResourceError as error:
        return _fail(str(error))
    except KeyboardInterrupt:
        written = scan(out, clean=False)
        return _fail(
            f"stopped; {written.embedded + written.refused:,} of {len(inputs.uris):,} images are "
            "in OUT: run the same command with --resume to finish",
            130,
        )
    except Exception as error:  # Ray's failures: a task that failed past its retries, a node
        log.debug("the job failed", exc_info=True)
        first = (str(error).strip().splitlines() or [type(error).__name__])[-1][:500]
        return _fail(
            f"the job failed ({type(error).__name__}: {first}); what was written is kept: "
            "run the same command with --resume to go on (-v shows more)",
            1,
        )
    after = scan(out)
    summary = Summary.of(
        inputs=len(inputs.uris),
        skipped=len(inputs.uris) - len(todo),
        todo=len(todo),
        embedded=result.embedded,
        refused=result.refused,
        seconds=result.seconds,
        ray_start_seconds=ray_start,
        out_embedded=after.embedded,
        out_refused=after.refused,
        missing=sum(uri not in after.done for uri in inputs.uris),
        duplicates=after.duplicates,
        out=out.uri(out.path),
        input_skipped=inputs.skipped,
    )
    print(json.dumps(summary.as_dict(), indent=2) if args.json else summary.text())
    return 1 if summary.faults else 0


if __name__ == "__main__":
    sys.exit(main())
