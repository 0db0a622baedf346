"""``smso-embed MODEL INPUT -o OUT``: embed a whole collection of images into Parquet.

The embedded engine (:mod:`batch.local_engine`) runs the job in this process; ``--engine ray``,
``--address`` or ``RAY_ADDRESS`` run it on Ray Data (:mod:`batch.ray_engine`, imported only
then). Either way the same images give the same OUT.

Exit status: 0 when every image of INPUT is in OUT once (embedded, or refused by the service's
rules and written to the errors table); 1 for a fault of the job (an image lost or repeated, a
model whose outputs are not finite, an engine's failure); 2 for a mistake in the command
(MODEL, INPUT or OUT unusable, flags that do not go together, said in one line); 130 when
stopped (Ctrl-C): what was written is kept, and the same command with ``--resume`` finishes the
job.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from batch.arg_types import count, positive, share
from batch.embedder import EmbedOptions
from batch.engine import Engine, EngineSettingsError
from batch.inputs import InputError, locate, resolve, utf8_path
from batch.job import JobOptions, JobResult, run_job
from batch.local_engine import LocalEngine, LocalOptions, default_local_options
from batch.lock import hold
from batch.model import ModelError, load_model_file
from batch.outputs import DTYPES, JobManifest, OutputError, prepare, scan
from batch.parts import WriteCounts, rewrite_part
from batch.plan import plan
from batch.stages import StageTimes
from batch.summary import Summary
from service.runtime.providers import runs_on_gpu

__all__ = ["main", "parser"]

log = logging.getLogger("batch")

EPILOG = """\
INPUT is a folder (its images, recursively), a glob ('photos/**/*.jpg', quoted), or a .parquet
or .csv file with a column of paths or URIs (--column). OUT gets two Parquet datasets:
OUT/embeddings (path, embedding, top-k labels and scores, typicality, model name, version and
card checksum) and OUT/errors (path, kind, message). Runs in this process (--engine local, the
default), or on Ray Data: --engine ray for a local Ray, --address or RAY_ADDRESS for a cluster.
See docs/batch.md.
"""

#: The flags that tune the Ray engine only (dest: flag).
RAY_FLAGS = {
    "actors": "--actors",
    "actor_cpus": "--actor-cpus",
    "gpus_per_actor": "--gpus-per-actor",
    "decode_cpus": "--decode-cpus",
    "decode_in_actors": "--decode-in-actors",
    "cpus": "--cpus",
}
#: The flags that tune the embedded engine only.
LOCAL_FLAGS = {"decoders": "--decoders", "sessions": "--sessions"}

#: The service's default limits (service.core.settings: max_pixels, max_upload_bytes).
MAX_PIXELS = 50_000_000
MAX_BYTES = 20 * 2**20


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="smso-embed",
        description="Run an exported SMSO model over a collection of images into Parquet: the "
        "same embeddings as the service's /embed, in this process or on Ray Data.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL", help="the .onnx file smso-export wrote (or a URI)")
    p.add_argument("input", metavar="INPUT", help="a folder, a glob, or a .parquet/.csv list")
    p.add_argument("-o", "--out", required=True, metavar="OUT", help="the output folder (or URI)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the job in OUT: images already there and unchanged are skipped, changed "
        "ones embedded again, deleted ones taken out (OUT may not exist yet)",
    )
    p.add_argument(
        "--retry-errors",
        action="store_true",
        help="with --resume: embed again the images OUT's errors table holds",
    )
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="float32",
        help="how each embedding is stored (float16: half the space; default float32)",
    )
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        help="local: this process, no Ray (the default); ray: Ray Data, on a local Ray or the "
        "cluster of --address / RAY_ADDRESS (the default when either is given)",
    )
    p.add_argument(
        "--address",
        help="a Ray cluster to run on, or auto for the one `ray start` ran here "
        "(default: RAY_ADDRESS; implies --engine ray)",
    )
    p.add_argument(
        "--normalize", action="store_true", help="L2-normalise each embedding (as /embed does)"
    )
    p.add_argument("--top-k", type=positive, default=5, help="classes per image (default 5)")
    p.add_argument("--column", default="path", help="the list's column of paths (default path)")
    p.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="in a folder or glob, follow symbolic links leading outside INPUT too (each folder "
        "is walked once: loops end); by default they are skipped and counted",
    )
    tuning = p.add_argument_group("how the work is spread (defaults suit the machine or cluster)")
    tuning.add_argument(
        "--batch-size",
        type=positive,
        help="images per inference call (default 256 on a GPU or Ray, 64 for the embedded engine "
        "on the CPU, where a large model's activations for 256 images outgrow the caches)",
    )
    tuning.add_argument(
        "--threads", type=int, default=None, help="onnxruntime threads per session (0: all cores)"
    )
    tuning.add_argument(
        "--decode-batch",
        type=positive,
        help="images per decode task (local 64, ray 1024)",
    )
    tuning.add_argument(
        "--rows-per-file", type=positive, default=8192, help="images per output file (8192)"
    )
    tuning.add_argument(
        "--providers", default="auto", help="onnxruntime providers (auto: CUDA where a GPU is)"
    )
    local = p.add_argument_group("the embedded engine (--engine local)")
    local.add_argument(
        "--decoders",
        type=count,
        help="threads reading and decoding (default: one per two cores on the CPU, one per core "
        "with a GPU; 0: each session decodes its own batches)",
    )
    local.add_argument(
        "--sessions",
        type=positive,
        help="onnxruntime sessions running at once (default: one per core on the CPU, one on a "
        "GPU)",
    )
    tuning = p.add_argument_group("the Ray engine (--engine ray)")
    tuning.add_argument("--actors", type=positive, help="inference actors (sessions)")
    tuning.add_argument("--actor-cpus", type=share, help="Ray CPUs each actor holds")
    tuning.add_argument(
        "--gpus-per-actor", type=share, help="Ray GPUs each actor holds (CUDA provider)"
    )
    tuning.add_argument(
        "--decode-cpus", type=share, help="Ray CPUs per decode task (0.5); given, decode tasks"
    )
    tuning.add_argument(
        "--decode-in-actors",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="each actor decodes its own images, no decode tasks (default on CPUs alone; "
        "--no-decode-in-actors, or --decode-cpus, for decode tasks)",
    )
    tuning.add_argument("--cpus", type=positive, help="CPUs of the local Ray (default: all)")
    limits = p.add_argument_group("the service's limits")
    limits.add_argument("--max-pixels", type=positive, default=MAX_PIXELS)
    limits.add_argument("--max-bytes", type=positive, default=MAX_BYTES)
    p.add_argument("--no-progress", action="store_true", help="no progress line")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the engine says")
    return p


class UsageError(ValueError):
    """Flags that do not go together (said in one line)."""


def _given(args: argparse.Namespace, flags: dict[str, str]) -> list[str]:
    given = [(flag, getattr(args, dest)) for dest, flag in flags.items()]
    return [flag for flag, value in given if value is not None]


def _engine(args: argparse.Namespace, model_bytes: int) -> Engine:
    """The engine the flags ask for: the embedded one unless --engine ray, --address or
    RAY_ADDRESS; :class:`UsageError` for another engine's flags."""
    joined = args.address or os.environ.get("RAY_ADDRESS")
    name = args.engine or ("ray" if joined else "local")
    if name == "local":
        if args.address:
            raise UsageError(
                "--address joins a Ray cluster, which --engine local does not use: give "
                "--engine ray (or leave --address out)"
            )
        wrong = _given(args, RAY_FLAGS)
        if wrong:
            raise UsageError(
                f"{', '.join(wrong)} tune the Ray engine: add --engine ray, or leave them out "
                "(the embedded engine takes --decoders and --sessions)"
            )
        defaults = default_local_options(args.providers, model_bytes=model_bytes)
        return LocalEngine(
            LocalOptions(
                decoders=defaults.decoders if args.decoders is None else args.decoders,
                sessions=args.sessions or defaults.sessions,
                threads=defaults.threads if args.threads is None else args.threads,
                decode_batch=args.decode_batch or defaults.decode_batch,
            )
        )
    wrong = _given(args, LOCAL_FLAGS)
    if wrong:
        raise UsageError(
            f"{', '.join(wrong)} tune the embedded engine, not Ray's: use --actors and "
            "--actor-cpus with --engine ray"
        )
    try:
        from batch.ray_engine import RayEngine  # Ray: only for this engine
    except ImportError as error:
        raise UsageError(
            f"the Ray engine needs Ray ({error}): pip install 'smso[batch]', or run without "
            "--engine ray, --address and RAY_ADDRESS"
        ) from None
    overrides = {
        "actors": args.actors,
        "actor_cpus": args.actor_cpus,
        "actor_gpus": args.gpus_per_actor,
        "threads": args.threads,
        "decode_cpus": args.decode_cpus,
        "decode_in_actors": args.decode_in_actors,
    }
    return RayEngine(
        address=args.address,
        cpus=args.cpus,
        overrides=overrides,
        decode_batch=args.decode_batch or 1024,
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
        if args.retry_errors and not args.resume:
            raise UsageError("--retry-errors retries a job's errors: give it with --resume")
        model = load_model_file(args.model)
        engine = _engine(args, len(model.data))
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
            dtype=args.dtype,
        )
        held.enter_context(hold(out))
        prepare(out, manifest, args.resume)
        work = plan(inputs.uris, scan(out), inputs.location, args.retry_errors)
    except (UsageError, ModelError, InputError, OutputError) as error:
        return _fail(str(error))
    except OSError as error:
        return _fail(f"{args.out}: {error}")
    batch_size = args.batch_size or (
        256 if engine.name == "ray" or runs_on_gpu(args.providers) else 64
    )
    embed = EmbedOptions(args.providers, args.threads or 0, batch_size, top_k, args.normalize)
    options = JobOptions(
        embed,
        rows_per_file=args.rows_per_file,
        max_pixels=args.max_pixels,
        max_bytes=args.max_bytes,
        dtype=args.dtype,
        progress=not args.no_progress and not args.json,
    )
    try:
        for part, paths in work.drop.items():  # changed, retried and deleted rows out first
            rewrite_part(out, part, paths)
        if work.todo:
            result = run_job(model, inputs.location, work.todo, out, options, engine)
        else:  # nothing to do: no engine to start
            result = JobResult(0, WriteCounts(), 0.0, StageTimes(), None)
    except EngineSettingsError as error:  # the Ray engine's: actors that leave no CPU
        return _fail(str(error))
    except KeyboardInterrupt:
        written = scan(out, clean=False)
        return _fail(
            f"stopped; {written.embedded + written.refused:,} of {len(inputs.uris):,} images are "
            "in OUT: run the same command with --resume to finish",
            130,
        )
    except Exception as error:  # the engine's failures: Ray's, a session's, a full disk
        log.debug("the job failed", exc_info=True)
        first = (str(error).strip().splitlines() or [type(error).__name__])[-1][:500]
        return _fail(
            f"the job failed ({type(error).__name__}: {first}); what was written is kept: "
            "run the same command with --resume to go on (-v shows more)",
            1,
        )
    after = scan(out)
    run = result.run
    summary = Summary.of(
        inputs=len(inputs.uris),
        skipped=work.unchanged,
        todo=len(work.todo),
        embedded=result.embedded,
        refused=result.refused,
        seconds=result.seconds,
        engine=run.engine if run else "",
        start_seconds=run.start_s if run else 0.0,
        out_embedded=after.embedded,
        out_refused=after.refused,
        missing=sum(uri not in after.held for uri in inputs.uris),
        duplicates=after.duplicates,
        out=out.uri(out.path),
        input_skipped=inputs.skipped,
        new=work.new,
        changed=work.changed,
        retried=work.retried,
        deleted=work.deleted,
        stages=result.stages.as_dict() if run else {},
        workers=dataclasses.asdict(run.workers) if run else {},
        bound=result.stages.bound(run.workers) if run else "",
        first_part_seconds=round(result.first_part_s, 3),
    )
    print(json.dumps(summary.as_dict(), indent=2) if args.json else summary.text())
    return 1 if summary.faults else 0


def command() -> NoReturn:
    """The ``smso-embed`` command: :func:`main`, then out of the process at once.

    Once the summary is printed, OUT's files are closed and its lock released, the interpreter's
    teardown (every module, session and buffer freed one by one: about 0.1 s of a 3 s job of
    10,000 images, measured in docs/batch.md) does nothing a user needs, so the process exits
    without it, as a C program would. An error escaping :func:`main` is raised as usual."""
    status = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    command()
