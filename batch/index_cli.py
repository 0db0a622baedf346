"""``smso-index OUT [OUT ...] -o GALLERY``: a nearest-neighbour gallery of what smso-embed wrote.

Reads the embeddings table of each OUT (:mod:`batch.gallery_rows`), and builds GALLERY or
brings it up to date with them (:func:`gallery.build.build`): after ``smso-embed --resume``, the
same command adds the new images, embeds nothing and drops the deleted ones. ``smso-serve
--gallery GALLERY`` serves it beside the same model. ``--duplicates THRESHOLD`` also writes the
collection's near-duplicate pairs (:mod:`batch.duplicates`).

Exit status: 0 when GALLERY holds every embedded image of the OUT folders; 2 for a mistake in
the command (an OUT or GALLERY unusable, said in one line).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from batch.arg_types import positive, similarity
from batch.duplicates import find_duplicates
from batch.gallery_rows import read_rows
from batch.inputs import InputError, locate
from batch.outputs import OutputError
from gallery.build import EXACT_BELOW, BuildOptions, build
from gallery.codes import Dtype
from gallery.search import load
from gallery.store import GalleryError, Hnsw

__all__ = ["main", "parser"]

EPILOG = """\
--dtype: f32 (4 bytes a dimension), f16 (2), i8 (1) or b1 (1 bit); docs/search.md gives the
recall each costs. Below --exact-below items a search scans every code (exact); from it up,
usearch's HNSW graph. See docs/search.md.
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="smso-index",
        description="Build or update a nearest-neighbour gallery from smso-embed's output.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("outs", nargs="+", metavar="OUT", help="smso-embed's output folders")
    p.add_argument("-o", "--output", required=True, metavar="GALLERY", help="the gallery folder")
    p.add_argument(
        "--dtype", choices=[d.value for d in Dtype], default="f32", help="stored codes (f32)"
    )
    p.add_argument(
        "--exact-below",
        type=int,
        default=EXACT_BELOW,
        help=f"fewer items than this: exact scan, no graph ({EXACT_BELOW:,})",
    )
    p.add_argument("--rebuild", action="store_true", help="from scratch, not an update")
    graph = p.add_argument_group("the HNSW graph (usearch)")
    graph.add_argument("--connectivity", type=positive, default=Hnsw.connectivity, help="M (16)")
    graph.add_argument(
        "--expansion-add", type=positive, default=Hnsw.expansion_add, help="efConstruction (128)"
    )
    graph.add_argument(
        "--expansion-search", type=positive, default=Hnsw.expansion_search, help="ef (64)"
    )
    graph.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads adding to the graph (1; more leave some images that no search finds: "
        "unum-cloud/USearch#735)",
    )
    dupes = p.add_argument_group("near-duplicates")
    dupes.add_argument(
        "--duplicates",
        type=similarity,
        metavar="THRESHOLD",
        help="write the pairs at this similarity or above (e.g. 0.98)",
    )
    dupes.add_argument(
        "--duplicates-out",
        metavar="PATH",
        help="where (default: GALLERY/duplicates.parquet)",
    )
    dupes.add_argument(
        "--neighbours", type=positive, default=10, help="neighbours examined per image (10)"
    )
    p.add_argument("--json", action="store_true", help="the summary as JSON on stdout")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _fail(message: str) -> int:
    print(f"smso-index: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(message)s",
    )
    folder = Path(args.output)
    options = BuildOptions(
        dtype=Dtype(args.dtype),
        exact_below=args.exact_below,
        hnsw=Hnsw(args.connectivity, args.expansion_add, args.expansion_search),
        rebuild=args.rebuild,
        threads=args.threads,
    )
    try:
        source = read_rows([locate(out) for out in args.outs])
        summary = build(folder, source.rows, source.stamp, source.classes, options)
        duplicates = None
        if args.duplicates is not None:
            target = Path(args.duplicates_out or folder / "duplicates.parquet")
            duplicates = find_duplicates(
                load(folder),
                source.rows.paths,
                source.rows.embeddings,
                args.duplicates,
                target,
                args.neighbours,
                args.threads,
            )
    except (InputError, OutputError, GalleryError) as error:
        return _fail(str(error))
    except OSError as error:
        return _fail(f"{error.filename or folder}: {error.strerror}")
    found = asdict(summary) | {
        "gallery": str(folder),
        "model": source.stamp.describe(),
        "duplicates": asdict(duplicates) if duplicates else None,
    }
    if args.json:
        print(json.dumps(found))
        return 0
    how = "built" if summary.rebuilt else "updated"
    print(
        f"smso-index: {how} {folder}: {summary.items:,} images of {source.stamp.describe()}, "
        f"{summary.dtype} codes, {summary.search} search, {summary.bytes_on_disk / 1e6:.1f} MB, "
        f"{summary.seconds:.1f} s"
    )
    print(
        f"  {summary.added:,} added, {summary.changed:,} changed, {summary.removed:,} removed, "
        f"{summary.kept:,} kept" + (f" ({summary.reason})" if summary.reason else "")
    )
    if duplicates:
        print(
            f"  {duplicates.pairs:,} near-duplicate pairs at similarity >= "
            f"{duplicates.threshold:g}: {duplicates.path}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
