"""Galleries (``smso-index``, :mod:`gallery`): how good the neighbours are, what approximate search
costs in recall, and what a gallery costs in time, disk and memory.

All on Fashion-MNIST through the shipped model (``--model``), the embeddings computed as the
service computes them (:mod:`bench.lib.model_outputs`) and cached under ``--cache``:

* ``quality``: gallery = the 60,000 training images, queries = the 10,000 test images, exact
  search: precision@10 and mAP@100 (:mod:`bench.lib.retrieval`) for each code (f32, f16, i8,
  b1), for the shipped model and for ``--baseline`` (a first-order model exported the same
  way), and how close to ``N(0, 1)`` each model's standardised embeddings are;
* ``crossover``: one query at a time, exact scan against HNSW graph, at growing sizes: where
  the graph starts to pay (``gallery.build.EXACT_BELOW``);
* ``recall``: at each of ``--sizes`` (the training images, then augmented training images
  through the model, :mod:`bench.lib.augment`): each code's HNSW graph against the exact f32
  neighbours (recall@10: ANN and code together) and against the exact search of the same codes
  (the graph alone); build time, size on disk, memory of a process that loads it (RSS), queries
  per second on one thread;
* ``faiss``: faiss-cpu's ``IndexHNSWFlat`` with the same graph settings on the same vectors,
  beside usearch's f32 graph (recall, build time, size, RSS, queries/s).

    python -m bench.search                                   # all, 60,000 and 1,000,000 items
    python -m bench.search --quick                           # 5,000 items, 500 queries
    python -m bench.search --only quality --baseline M.onnx  # or: crossover, recall, faiss

Results: tables on stdout and ``bench/results/search.json``.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib import launch, procfs, report, wrk
from bench.lib.augment import augmented
from bench.lib.model_outputs import Outputs, outputs
from bench.lib.payloads import encode, fashion_mnist, multipart_body
from bench.lib.retrieval import average_precision, precision, recall, self_found
from bench.lib.timing import timed_call
from gallery.build import BuildOptions, Rows, build
from gallery.codes import Dtype
from gallery.search import Gallery, GraphSearch, load
from gallery.stamp import Stamp
from gallery.store import Hnsw

SHIPPED = Path("models/fashion-mnist-smso/model.onnx")
SECTIONS = ("quality", "crossover", "recall", "faiss", "serve")
CLASSES = tuple(str(i) for i in range(10))
STAMP = Stamp("bench", "0", "0" * 64)  # the galleries here are never served
_FIELDS = ("embeddings", "top1", "max_softmax", "typicality")
NEVER = 10**12  # exact_below: always a scan
ALWAYS = 0  # exact_below: always a graph


@dataclass(frozen=True)
class Collection:
    """The gallery's images' outputs and true labels, and the queries'."""

    items: Outputs
    item_labels: np.ndarray  # (N,) int: the dataset's label (an augmented image: its source's)
    queries: Outputs
    query_labels: np.ndarray


def collection(model: Path, size: int, queries: int, cache: Path | None) -> Collection:
    """``size`` gallery items (the training images, then augmented ones) and ``queries`` test
    images, through ``model``."""
    train, train_labels = fashion_mnist("train")
    test, test_labels = fashion_mnist("test")
    real = min(size, len(train))
    first = outputs(model, "train", real, lambda s, n: train[s : s + n], cache)
    parts = [first]
    if size > real:
        extra = size - real
        parts.append(
            outputs(
                model,
                "augmented",
                extra,
                lambda s, n: augmented(train, len(train) + s, n),
                cache,
            )
        )
    items = _joined(parts)
    labels = train_labels[np.arange(size) % len(train)]
    asked = outputs(model, "test", queries, lambda s, n: test[s : s + n], cache)
    return Collection(items, labels, asked, test_labels[:queries])


def _joined(parts: Sequence[Outputs]) -> Outputs:
    return Outputs(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))


def _first(whole: Outputs, size: int) -> Outputs:
    return Outputs(*(getattr(whole, f)[:size] for f in _FIELDS))


def rows_of(items: Outputs) -> Rows:
    size = len(items.embeddings)
    paths = [f"train/{i:05d}.png" if i < 60_000 else f"augmented/{i:07d}.png" for i in range(size)]
    zeros = np.zeros(size, np.int64)
    return Rows(paths, items.embeddings, items.top1, zeros, zeros)


def built(
    folder: Path, rows: Rows, dtype: Dtype, exact_below: int
) -> tuple[Gallery, dict[str, Any]]:
    """A gallery of ``rows`` in ``folder``, loaded, and its build's seconds and bytes."""
    options = BuildOptions(dtype=dtype, exact_below=exact_below, rebuild=True)
    summary = build(folder, rows, STAMP, CLASSES, options)
    return load(folder), {"build_s": summary.seconds, "bytes_on_disk": summary.bytes_on_disk}


# --- quality ---------------------------------------------------------------------------------


def quality(
    model: Path, items: int, queries: int, dtypes: Sequence[Dtype], cache: Path | None
) -> dict[str, Any]:
    """precision@10 and mAP@100 of one model's exact neighbours, per code."""
    data = collection(model, items, queries, cache)
    rows = rows_of(data.items)
    answer: dict[str, Any] = {
        "model": str(model),
        "dimension": int(data.items.embeddings.shape[1]),
        "top1_accuracy": float((data.queries.top1 == data.query_labels).mean()),
        "codes": {},
    }
    own = np.arange(0, len(rows), max(1, len(rows) // 1000))  # 1,000 gallery images as queries
    with tempfile.TemporaryDirectory() as scratch:
        for dtype in dtypes:
            gallery, cost = built(Path(scratch) / dtype.value, rows, dtype, NEVER)
            found = gallery.nearest(data.queries.embeddings, 100, exact=True, threads=0)
            themselves = gallery.nearest(data.items.embeddings[own], 1, exact=True, threads=0)
            truth = data.item_labels, data.query_labels
            answer["codes"][dtype.value] = {
                "precision_at_10": precision(found.rows[:, :10], *truth),
                "map_at_100": average_precision(found.rows, *truth),
                "self_first_at_0_999": self_found(
                    themselves.rows, themselves.similarities, own, 0.999
                ),
                "bytes_per_item": gallery.codec.encode(data.items.embeddings[:1]).nbytes,
                **cost,
            }
            answer["gaussian"] = gallery.codec.standardisation.check.to_json()
    return answer


# --- crossover -------------------------------------------------------------------------------


def _median_us(call: Callable[[np.ndarray], object], queries: np.ndarray) -> float:
    """The median microseconds of ``call`` on one query, each of ``queries`` in turn."""
    return float(np.median([timed_call(functools.partial(call, q)) for q in queries]) * 1e6)


def _per_query_us(gallery: Gallery, queries: np.ndarray, exact: bool) -> float:
    """The median microseconds of one query (k = 10, one thread)."""
    return _median_us(lambda q: gallery.nearest(q[None], 10, exact=exact, threads=1), queries)


def _library_query_us(gallery: Gallery, queries: np.ndarray) -> float | None:
    """The median microseconds of one query in usearch's graph alone (k = 10, one thread):
    without the standardisation, the keys' rows and the paths the gallery adds."""
    searcher = gallery.searcher
    if not isinstance(searcher, GraphSearch):
        return None
    return _median_us(
        lambda c: searcher.index.search(c, 10, threads=1), gallery.codec.encode(queries)
    )


def crossover(model: Path, sizes: Sequence[int], cache: Path | None) -> list[dict[str, Any]]:
    """One query's time, exact scan against graph, at each of ``sizes`` (f32)."""
    data = collection(model, max(sizes), 200, cache)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for size in sizes:
            items = _first(data.items, size)
            graph, _ = built(Path(scratch) / f"g{size}", rows_of(items), Dtype.F32, ALWAYS)
            results.append(
                {
                    "items": size,
                    "exact_us": _per_query_us(graph, data.queries.embeddings, exact=True),
                    "graph_us": _per_query_us(graph, data.queries.embeddings, exact=False),
                }
            )
    return results


# --- recall, footprint -----------------------------------------------------------------------

_RSS = """
import sys, numpy as np
from pathlib import Path
{imports}
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1]) * 1024
before = rss()
{load}
loaded = rss()
queries = np.load(sys.argv[2])
{search}
print(before, loaded, rss())
"""

#: (imports, load, search) of a gallery, the imports before the first measure of RSS
_USEARCH = (
    "from gallery.search import load",
    "g = load(Path(sys.argv[1]))",
    "g.nearest(queries, 10, threads=1)",
)
_FAISS = (
    "import faiss\nfaiss.omp_set_num_threads(1)",
    "g = faiss.read_index(sys.argv[1])",
    "q = queries / np.linalg.norm(queries, axis=1, keepdims=True)\ng.search(q, 10)",
)


def resident(target: Path, queries: np.ndarray, code: tuple[str, str, str]) -> dict[str, int]:
    """Memory of a fresh process that loads ``target`` and then searches ``queries``: bytes
    of RSS the load added, and the search after it."""
    with tempfile.TemporaryDirectory() as scratch:
        asked = Path(scratch) / "queries.npy"
        np.save(asked, queries)
        script = _RSS.format(imports=code[0], load=code[1], search=code[2])
        out = subprocess.run(
            [sys.executable, "-c", script, str(target), str(asked)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    before, loaded, searched = (int(value) for value in out.split())
    return {"rss_load_bytes": loaded - before, "rss_after_search_bytes": searched - before}


def recall_at(
    data: Collection, size: int, dtypes: Sequence[Dtype], scratch: Path
) -> dict[str, Any]:
    """Each code's graph at ``size`` items against exact search."""
    items = _first(data.items, size)
    rows = rows_of(items)
    queries = data.queries.embeddings
    answer: dict[str, Any] = {"items": size, "queries": len(queries), "codes": {}}
    truth: np.ndarray | None = None
    for dtype in dtypes:
        folder = scratch / f"{dtype.value}-{size}"
        gallery, cost = built(folder, rows, dtype, ALWAYS)
        exact = gallery.nearest(queries, 10, exact=True, threads=0).rows
        if truth is None:  # f32 comes first: the exact neighbours of the embeddings
            truth = exact
        start = time.perf_counter()
        found = gallery.nearest(queries, 10, threads=1)
        rate = len(queries) / (time.perf_counter() - start)
        answer["codes"][dtype.value] = {
            "recall_at_10": recall(found.rows, truth),
            "recall_at_10_of_the_codes": recall(found.rows, exact),
            "exact_codes_recall_at_10": recall(exact, truth),
            "queries_per_s_1_thread": rate,
            "single_query_us": _per_query_us(gallery, queries[:200], exact=False),
            "library_query_us": _library_query_us(gallery, queries[:200]),
            **cost,
            **resident(folder, queries[:1000], _USEARCH),
        }
        del gallery
        # only the latest size's folders are kept: a million items' four codes on disk at once
        # are not needed
    answer["truth"] = truth
    return answer


def faiss_at(data: Collection, size: int, truth: np.ndarray, scratch: Path) -> dict[str, Any]:
    """faiss's HNSW (flat f32, inner product of the standardised, normalised vectors, the
    cosine usearch computes) with usearch's graph settings."""
    import faiss

    faiss.omp_set_num_threads(1)  # as usearch's one adding thread (gallery.build.BuildOptions)
    hnsw = Hnsw()
    fitted = load(scratch / f"f32-{size}").codec.standardisation

    def unit(x: np.ndarray) -> np.ndarray:
        u = fitted.apply(x)
        return np.ascontiguousarray(u / np.linalg.norm(u, axis=1, keepdims=True), np.float32)

    items = unit(data.items.embeddings[:size])
    queries = unit(data.queries.embeddings)
    index = faiss.IndexHNSWFlat(items.shape[1], hnsw.connectivity, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = hnsw.expansion_add
    start = time.perf_counter()
    index.add(items)
    build_s = time.perf_counter() - start
    index.hnsw.efSearch = hnsw.expansion_search
    path = scratch / f"faiss-{size}.index"
    faiss.write_index(index, str(path))
    start = time.perf_counter()
    _, found = index.search(queries, 10)
    rate = len(queries) / (time.perf_counter() - start)
    one_query_us = _median_us(lambda q: index.search(q[None], 10), queries[:200])
    return {
        "recall_at_10": recall(found, truth),
        "queries_per_s_1_thread": rate,
        "single_query_us": one_query_us,  # faiss's own call: the whole query
        "library_query_us": one_query_us,
        "build_s": build_s,
        "bytes_on_disk": path.stat().st_size,
        **resident(path, data.queries.embeddings[:1000], _FAISS),
    }


# --- serve ---------------------------------------------------------------------------------


def served_gallery(model: Path, data: Collection, size: int, dtype: Dtype, cache: Path) -> Path:
    """A gallery of the first ``size`` items stamped with ``model``'s card, kept in ``cache``
    (built again only when the model or the size changed)."""
    from gallery.store import GalleryError, read_manifest
    from service.runtime.backend import read_card

    card = read_card(model)
    stamp = Stamp.of(card)
    folder = cache / f"gallery-{stamp.card_sha256[:12]}-{size}-{dtype.value}"
    try:
        manifest = read_manifest(folder)
        if manifest.stamp == stamp and manifest.count == size:
            return folder
    except GalleryError:
        pass
    rows = rows_of(_first(data.items, size))
    classes = tuple(str(c) for c in card.classes)
    build(folder, rows, stamp, classes, BuildOptions(dtype=dtype, exact_below=ALWAYS, rebuild=True))
    return folder


def serve(
    model: Path, size: int, dtype: Dtype, rounds: int, seconds: int, cache: Path
) -> dict[str, Any]:
    """``/search?k=10`` against ``/embed`` on the same image, the gallery of ``size`` items
    served beside ``model``: wrk at 1 connection (p50) and 16 (p99, requests/s), in
    interleaved rounds; the server's memory; a gallery image finding itself."""
    import httpx

    data = collection(model, size, 10, cache)
    folder = served_gallery(model, data, size, dtype, cache)
    train, _ = fashion_mnist("train")
    query = multipart_body(encode(fashion_mnist("test")[0][0], "PNG"), "q.png", "image/png")
    routes = {"embed": "/embed", "search": "/search?k=10"}
    runs: dict[str, dict[int, list[wrk.WrkResult]]] = {r: {1: [], 16: []} for r in routes}
    with launch.smso_serve("--model-path", str(model), "--gallery", str(folder)) as server:
        memory_loaded = procfs.group_memory_mib(server.pid)
        itself = httpx.post(
            f"{server.base}/search?k=1",
            files={"file": ("train-0.png", encode(train[0], "PNG"), "image/png")},
            timeout=30,
        ).json()["results"][0]["neighbours"][0]
        for number in range(rounds):
            order = list(routes) if number % 2 == 0 else list(routes)[::-1]
            for name in order:
                for connections in (1, 16):
                    result = wrk.drive(server.base + routes[name], query, connections, seconds)
                    runs[name][connections].append(result)
        memory_after = procfs.group_memory_mib(server.pid)

    def median(name: str, connections: int, field: str) -> float:
        return float(np.median([getattr(r, field) for r in runs[name][connections]]))

    differences = [
        s.p50_ms - e.p50_ms for s, e in zip(runs["search"][1], runs["embed"][1], strict=True)
    ]
    return {
        "items": size,
        "dtype": dtype.value,
        "rounds": rounds,
        "seconds_per_run": seconds,
        "self_retrieval": itself,
        "search_minus_embed_p50_ms": float(np.median(differences)),
        "server_memory_mib": {"loaded": memory_loaded, "after": memory_after},
        "routes": {
            name: {
                "p50_ms_1_connection": median(name, 1, "p50_ms"),
                "p99_ms_16_connections": median(name, 16, "p99_ms"),
                "requests_per_s_16_connections": median(name, 16, "requests_per_s"),
                "errors": sum(r.errors + r.status_errors for c in runs[name].values() for r in c),
                "runs": {str(c): [vars(r) for r in rs] for c, rs in runs[name].items()},
            }
            for name in routes
        },
    }


def print_serve(result: dict[str, Any]) -> None:
    header = ["route", "p50 ms, 1 conn.", "p99 ms, 16 conn.", "requests/s, 16 conn.", "errors"]
    rows = [
        [
            name,
            f"{r['p50_ms_1_connection']:.2f}",
            f"{r['p99_ms_16_connections']:.2f}",
            f"{r['requests_per_s_16_connections']:,.0f}",
            str(r["errors"]),
        ]
        for name, r in result["routes"].items()
    ]
    print(report.markdown_table(header, rows))
    print(
        f"{result['items']:,} items ({result['dtype']}): /search p50 - /embed p50 = "
        f"{result['search_minus_embed_p50_ms']:+.2f} ms (median of {result['rounds']} rounds); "
        f"a gallery image found {result['self_retrieval']['path']} first at similarity "
        f"{result['self_retrieval']['similarity']:.6f}"
    )


# --- the command -----------------------------------------------------------------------------


def _pct(value: float) -> str:
    return f"{value:.4f}"


def _mib(value: float) -> str:
    return f"{value / 2**20:,.1f}"


def print_quality(results: list[dict[str, Any]]) -> None:
    header = ["model", "p", "code", "bytes/item", "P@10", "mAP@100", "itself first"]
    rows = []
    for entry in results:
        for code, value in entry["codes"].items():
            rows.append(
                [
                    Path(entry["model"]).parent.name or entry["model"],
                    str(entry["dimension"]),
                    code,
                    str(value["bytes_per_item"]),
                    _pct(value["precision_at_10"]),
                    _pct(value["map_at_100"]),
                    report.percent(value["self_first_at_0_999"]),
                ]
            )
    print(report.markdown_table(header, rows))


def print_recall(results: list[dict[str, Any]]) -> None:
    header = [
        "items", "code", "recall@10", "graph alone", "queries/s", "1 query us", "library us",
        "build s", "disk MiB", "RSS MiB",
    ]  # fmt: skip
    rows = []
    for entry in results:
        for code, value in entry["codes"].items():
            rows.append(
                [
                    f"{entry['items']:,}",
                    code,
                    _pct(value["recall_at_10"]),
                    _pct(value.get("recall_at_10_of_the_codes", value["recall_at_10"])),
                    f"{value['queries_per_s_1_thread']:,.0f}",
                    f"{value['single_query_us']:,.0f}",
                    f"{value['library_query_us'] or float('nan'):,.0f}",
                    f"{value['build_s']:,.1f}",
                    _mib(value["bytes_on_disk"]),
                    _mib(value["rss_after_search_bytes"]),
                ]
            )
    print(report.markdown_table(header, rows))


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.search", description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=SHIPPED)
    p.add_argument("--baseline", type=Path, help="a second model for the quality table")
    p.add_argument("--sizes", default="60000,1000000", help="gallery sizes for recall and faiss")
    p.add_argument("--queries", type=int, default=10_000, help="test images as queries")
    p.add_argument(
        "--quality-items", type=int, default=60_000, help="training images in quality's gallery"
    )
    p.add_argument("--dtypes", default="f32,f16,i8,b1")
    p.add_argument("--only", default=",".join(SECTIONS), help=", ".join(SECTIONS))
    p.add_argument("--serve-size", type=int, help="serve's gallery (default: the largest size)")
    p.add_argument("--serve-rounds", type=int, default=3)
    p.add_argument("--serve-seconds", type=int, default=10, help="each wrk run")
    p.add_argument("--quick", action="store_true", help="5,000 items, 500 queries")
    p.add_argument("--cache", type=Path, default=Path("bench/results/search-cache"))
    p.add_argument("--out", type=Path, default=Path("bench/results/search.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.queries, args.quality_items = "5000", 500, 5000
        args.serve_rounds, args.serve_seconds = 1, 3
    unknown = set(args.only.split(",")) - set(SECTIONS)
    if unknown:
        p.error(f"--only: unknown {', '.join(sorted(unknown))}; give some of {', '.join(SECTIONS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    only = set(args.only.split(","))
    sizes = [int(size) for size in args.sizes.split(",")]
    asked = [Dtype(value) for value in args.dtypes.split(",")]
    dtypes = [Dtype.F32] + [d for d in asked if d is not Dtype.F32]  # f32: the exact truth
    results: dict[str, Any] = {"machine": report.machine(), "sizes": sizes, "queries": args.queries}
    if "quality" in only:
        models = [args.model] + ([args.baseline] if args.baseline else [])
        results["quality"] = [
            quality(m, args.quality_items, args.queries, dtypes, args.cache) for m in models
        ]
        print_quality(results["quality"])
    if "crossover" in only:
        steps = [s for s in (500, 1_000, 2_000, 5_000, 10_000, 20_000, 60_000) if s <= max(sizes)]
        results["crossover"] = crossover(args.model, steps, args.cache)
        print(
            report.markdown_table(
                ["items", "exact scan us", "graph us"],
                [
                    [f"{r['items']:,}", f"{r['exact_us']:,.0f}", f"{r['graph_us']:,.0f}"]
                    for r in results["crossover"]
                ],
            )
        )
    if only & {"recall", "faiss"}:
        data = collection(args.model, max(sizes), args.queries, args.cache)
        results["recall"] = []
        for size in sizes:
            with tempfile.TemporaryDirectory() as scratch:
                entry = recall_at(data, size, dtypes, Path(scratch))
                truth = entry.pop("truth")
                if "faiss" in only:
                    entry["codes"]["faiss f32"] = faiss_at(data, size, truth, Path(scratch))
            results["recall"].append(entry)
            print_recall(results["recall"][-1:])
    if "serve" in only:
        if not wrk.available():
            print("serve skipped: wrk is not installed (Debian: apt-get install wrk)")
        else:
            size = args.serve_size or max(sizes)
            results["serve"] = serve(
                args.model, size, Dtype.F32, args.serve_rounds, args.serve_seconds, args.cache
            )
            print_serve(results["serve"])
    report.save(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
