"""The served typicality score: out-of-distribution AUROC, drift alarms, and cost.

Everything goes through the real server (``smso-serve`` in a subprocess on the shipped model):

* **Separation.** Fashion-MNIST's 10,000 test images (in-distribution) and five offline
  out-of-distribution sets, preprocessed as the model card says and sent as binary ``FP32``
  Open Inference Protocol requests of ``--batch`` images, asking for ``logits``, ``embedding``,
  ``typicality`` and ``typicality_p_value``. For each set, AUROC and FPR at 95 % TPR (OOD =
  positive, higher = less typical) of the served score and of three baselines computed from the
  same served outputs::

      MSP          -max_k softmax(l)_k
      energy       -log sum_k exp(l_k)
      Mahalanobis  (z - mu)^T S^+ (z - mu)    mu, S of the 5,000 validation embeddings

  The sets: scikit-learn's ``load_digits`` (8x8 scaled to 20x20, padded to 28x28), grey 28x28
  crops of the photographs bundled in scikit-image's wheel, uniform noise, inverted test images
  (``255 - x``) and test images rotated by 90 degrees.
* **Drift.** Streams of one-image requests (the server's window counts images): ``W`` = 200
  in-distribution requests, then 10 % out-of-distribution images (a mix of the five sets) until
  ``smso_drift_alarm`` reads 1 on ``/metrics`` (scraped after every request): the number of mixed
  requests it took, median and 90th percentile over ``--streams`` fresh servers. And
  ``--id-requests`` purely in-distribution requests (test images in ``--id-streams`` orders),
  each on a fresh server, that must raise no alarm (the gauge and the ``drift`` log line).
* **Cost.** Requests per second of a server with typicality against one with
  ``SMSO_TYPICALITY=false`` on the file without the score in its graph, in interleaved rounds whose
  order alternates; the ratio is the median of the rounds' ratios (target >= 0.95), for
  ``/classify`` with one PNG and for a 64-image binary ``FP32`` infer request. Beside it the
  server's CPU time per request (user + system, all its threads, from ``/proc``), whose ratio off/on
  is steadier than requests/s when the clients share the cores with the server.

While the server does not serve typicality yet (an older checkout), the score and p-value are
computed here with :mod:`modelcard.typicality` from the served logits and embedding and the card's
reference statistics, and drift by the same binomial rule on those p-values; the JSON says which
(``source``: ``served`` or ``client``).

    python -m experiments.typicality            # the full run (several minutes on 2 cores)
    python -m experiments.typicality --quick    # seconds: small sets, one short stream (tests)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from bench.lib import RESULTS, SHIPPED, launch, report
from bench.lib.load import drive, multipart, post
from bench.lib.metrics import scrape
from bench.lib.payloads import Body, encode, fashion_mnist, infer_body
from bench.lib.procfs import group_cpu_seconds

MODEL = SHIPPED
CONFIG = SHIPPED.parent / "config.json"
OOD_SETS = ("digits", "photos", "noise", "inverted", "rot90")
METHODS = ("typicality", "msp", "energy", "mahalanobis")
#: scikit-image's sample photographs shipped inside its wheel (read from disk: no download)
PHOTOS = (
    "astronaut.png",
    "camera.png",
    "coffee.png",
    "chelsea.png",
    "rocket.jpg",
    "ihc.png",
    "hubble_deep_field.jpg",
    "moon.png",
    "page.png",
    "text.png",
    "coins.png",
    "grass.png",
    "gravel.png",
    "brick.png",
    "retina.jpg",
    "motorcycle_left.png",
)
OUTPUTS = ("logits", "embedding", "typicality", "typicality_p_value")
ALPHA = 0.01  # the p-value below which the server's drift window counts an image


# --- data ---------------------------------------------------------------------------------------


def validation_images() -> np.ndarray:
    """The shipped model's validation split (uint8 (5000, 28, 28)): the first ``val_size`` of a
    permutation seeded with its config's seed, as ``training.datasets.fashion_mnist`` holds out."""
    config = json.loads(CONFIG.read_text())
    images, labels = fashion_mnist("train")
    order = np.random.default_rng(config["seed"]).permutation(len(labels))
    return images[np.sort(order[: config["val_size"]])]


def digits() -> np.ndarray:
    """scikit-learn's 1,797 handwritten digits: 8x8 (0..16) -> 20x20 bilinear, padded to 28x28."""
    from sklearn.datasets import load_digits

    out = np.zeros((len(load_digits().images), 28, 28), np.uint8)
    for i, image in enumerate(load_digits().images):
        small = Image.fromarray((image / 16 * 255).astype(np.uint8)).resize(
            (20, 20), Image.Resampling.BILINEAR
        )
        out[i, 4:24, 4:24] = np.asarray(small)
    return out


def photos(rng: np.random.Generator, per_photo: int = 250) -> np.ndarray:
    """Grey crops of scikit-image's bundled photographs: squares of 28, 56 or 84 px at random
    places, scaled to 28x28: (16 * per_photo, 28, 28) uint8."""
    import skimage.data

    folder = Path(skimage.data.__file__).parent
    crops = []
    for name in PHOTOS:
        grey = np.asarray(Image.open(folder / name).convert("L"))  # (H, W) uint8
        height, width = grey.shape
        for _ in range(per_photo):
            size = int(rng.choice([28, 56, 84]))
            size = size if size <= min(height, width) else 28
            y, x = rng.integers(0, height - size + 1), rng.integers(0, width - size + 1)
            crop = Image.fromarray(grey[y : y + size, x : x + size]).resize(
                (28, 28), Image.Resampling.BILINEAR
            )
            crops.append(np.asarray(crop))
    return np.stack(crops)


def ood_sets(test: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The five out-of-distribution sets, uint8 (N, 28, 28) each."""
    return {
        "digits": digits(),
        "photos": photos(rng),
        "noise": rng.integers(0, 256, (5000, 28, 28), dtype=np.uint8),
        "inverted": 255 - test,
        "rot90": np.ascontiguousarray(np.rot90(test, k=1, axes=(1, 2))),
    }


# --- the server ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Card:
    """What the study needs of the shipped model's card."""

    name: str
    mean: float
    std: float
    raw: dict[str, Any]

    @classmethod
    def read(cls, model: Path) -> Card:
        import onnxruntime

        from service.core.card import parse_card

        session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        card, raw = parse_card(session.get_modelmeta().custom_metadata_map)
        pre = card.preprocessing
        return cls(card.name, pre.mean[0], pre.std[0], raw)

    def preprocess(self, images: np.ndarray) -> np.ndarray:
        """uint8 (N, 28, 28) -> float32 (N, 1, 28, 28): ``(v / 255 - mean) / std``."""
        return ((images.astype(np.float32) / 255.0 - self.mean) / self.std)[:, None]


def binary_infer(tensor: np.ndarray, outputs: Sequence[str]) -> Body:
    """A binary ``FP32`` infer request asking for ``outputs`` as binary."""
    return infer_body(tensor, {name: {"binary_data": True} for name in outputs})


def decode_response(response: httpx.Response) -> dict[str, np.ndarray]:
    """A binary infer answer's outputs by name (float32 arrays of their shapes)."""
    length = int(response.headers.get("Inference-Header-Content-Length", len(response.content)))
    header = json.loads(response.content[:length])
    out, offset = {}, length
    for entry in header["outputs"]:
        size = entry["parameters"]["binary_data_size"]
        data = np.frombuffer(response.content[offset : offset + size], "<f4")
        out[entry["name"]] = data.reshape(entry["shape"])
        offset += size
    return out


class Client:
    """Infer requests to one server; the score computed here when the server has none."""

    def __init__(self, base: str, card: Card) -> None:
        self.http = httpx.Client(timeout=120)
        self.url = f"{base}/v2/models/{card.name}/infer"
        self.base = base
        self.card = card
        self.outputs: tuple[str, ...] = OUTPUTS
        if self._post(card.preprocess(np.zeros((1, 28, 28), np.uint8))).status_code != 200:
            self.outputs = OUTPUTS[:2]  # an older server: score from logits and embedding here
        self.source = "served" if self.outputs == OUTPUTS else "client"
        self.local = None
        if self.source == "client":
            from modelcard.typicality import Typicality

            self.local = Typicality.from_card(card.raw["typicality"])
        #: "served" when /metrics has the drift gauges, else "client" (the rule applied here)
        self.drift = "served" if "smso_drift_alarm" in self.metrics() else "client"

    def close(self) -> None:
        self.http.close()

    def _post(self, tensor: np.ndarray) -> httpx.Response:
        body = binary_infer(tensor, self.outputs)
        return self.http.post(self.url, content=body.data, headers=body.headers)

    def infer(self, images: np.ndarray, batch: int) -> dict[str, np.ndarray]:
        """The four outputs of uint8 ``images`` (N, 28, 28), in requests of ``batch``."""
        parts: list[dict[str, np.ndarray]] = []
        for start in range(0, len(images), batch):
            response = self._post(self.card.preprocess(images[start : start + batch]))
            response.raise_for_status()
            parts.append(decode_response(response))
        out = {k: np.concatenate([p[k] for p in parts]).astype(np.float64) for k in parts[0]}
        if self.local is not None:
            out["typicality"] = self.local.score(out["logits"], out["embedding"])
            out["typicality_p_value"] = self.local.p_value(out["typicality"])
        return out

    def metrics(self) -> dict[str, float]:
        """The server's ``/metrics`` (the drift gauges absent before the server has them)."""
        return scrape(f"{self.base}/metrics")


def serve(
    env: dict[str, str] | None = None, log: Path | None = None, model: Path = MODEL
) -> launch.Server:
    """A fresh server on ``model`` (the shipped one; warnings logged to ``log``)."""
    settings = {"SMSO_MAX_WAIT_MS": "2"} | (env or {})
    return launch.smso_serve("--model-path", str(model), settings=settings, log=log)


@contextlib.contextmanager
def server(
    env: dict[str, str] | None = None, log: Path | None = None, model: Path = MODEL
) -> Iterator[str]:
    """:func:`serve`'s URL, for as long as the ``with`` block runs."""
    with serve(env, log, model) as running:
        yield running.base


# --- separation ---------------------------------------------------------------------------------


def baselines(out: dict[str, np.ndarray], maha: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
    """Each method's score (higher = less typical) from one set's served outputs: (N,) each."""
    logits = out["logits"]
    top = logits.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))  # log sum_k exp(l_k)
    mean, precision = maha
    centred = out["embedding"] - mean  # (N, p)
    return {
        "typicality": out["typicality"],
        "msp": -np.exp(top[:, 0] - log_z),
        "energy": -log_z,
        "mahalanobis": np.einsum("ij,jk,ik->i", centred, precision, centred),
    }


def separation(id_scores: np.ndarray, ood_scores: np.ndarray) -> dict[str, float]:
    """AUROC and FPR at 95 % TPR, out-of-distribution as the positive class."""
    from sklearn.metrics import roc_auc_score, roc_curve

    labels = np.r_[np.zeros(len(id_scores)), np.ones(len(ood_scores))]
    scores = np.r_[id_scores, ood_scores]
    fpr, tpr, _ = roc_curve(labels, scores)
    return {
        "auroc": float(roc_auc_score(labels, scores)),
        "fpr_at_95_tpr": float(fpr[np.searchsorted(tpr, 0.95, side="left")]),
    }


def measure_separation(client: Client, data: dict[str, np.ndarray], batch: int) -> dict[str, Any]:
    """Served outputs of every set; the methods' AUROC and FPR per OOD set and their means."""
    val = client.infer(data["val"], batch)["embedding"]
    maha = (val.mean(axis=0), np.linalg.pinv(np.cov(val, rowvar=False)))
    served = {k: client.infer(data[k], batch) for k in ("test", *OOD_SETS)}
    scores = {k: baselines(v, maha) for k, v in served.items()}
    sets = {s: {m: separation(scores["test"][m], scores[s][m]) for m in METHODS} for s in OOD_SETS}
    mean = {m: statistics.fmean(sets[s][m]["auroc"] for s in OOD_SETS) for m in METHODS}
    p = served["test"]["typicality_p_value"]
    return {
        "sets": sets,
        "mean_auroc": mean,
        "images": {k: len(data[k]) for k in data},
        "test_accuracy": float((served["test"]["logits"].argmax(1) == data["test_labels"]).mean()),
        "test_share_p_below_0.01": float((p < ALPHA).mean()),
        "ood_p_values": {s: served[s]["typicality_p_value"] for s in OOD_SETS},
        "test_p_values": p,
    }


# --- drift --------------------------------------------------------------------------------------


class Window:
    """The server's drift rule, for a server without it: the last ``size`` images' count of
    p < 0.01 against Binomial(n, 0.01); alarm when ``P(X >= count) < alarm_p``."""

    def __init__(self, size: int, alarm_p: float) -> None:
        self.size, self.alarm_p = size, alarm_p
        self.flags: list[bool] = []

    def add(self, p_value: float) -> bool:
        from scipy.stats import binom

        self.flags = [*self.flags, p_value < ALPHA][-self.size :]
        # a window not yet full is tested as if its missing images were typical (as the server)
        tail = binom.sf(sum(self.flags) - 1, self.size, ALPHA)
        return bool(tail < self.alarm_p)


def stream(
    client: Client,
    images: np.ndarray,
    warm_up: int,
    window: int,
    alarm_p: float,
    scrape_every: int,
    log: Path,
) -> dict[str, Any]:
    """One image per request; after ``warm_up`` requests, the first request (counted from the
    end of the warm-up) after which the alarm reads 1, or None; and the ``drift`` log lines."""
    simulated = Window(window, alarm_p) if client.drift == "client" else None
    first = None
    for i, image in enumerate(images):
        out = client.infer(image[None], 1)
        if simulated is not None:
            alarm = simulated.add(float(out["typicality_p_value"][0]))
        elif (i + 1) % scrape_every == 0 or i + 1 == len(images):
            alarm = client.metrics().get("smso_drift_alarm", 0.0) == 1.0
        else:
            continue
        if alarm and first is None:
            first = i + 1 - warm_up
            if warm_up < i + 1:  # the mixed part: its first alarm is all we want
                break
    lines = [x for x in log.read_text().splitlines() if " drift: " in x]  # the WARNING line
    return {"first_alarm": first, "requests": i + 1, "drift_log_lines": len(lines)}


def measure_drift(
    card: Card, data: dict[str, np.ndarray], args: argparse.Namespace, folder: Path
) -> dict[str, Any]:
    """Detection delays at 10 % OOD and alarms in purely in-distribution streams."""
    rng = np.random.default_rng(17)
    env = {"SMSO_DRIFT_WINDOW": str(args.window), "SMSO_DRIFT_ALARM_P": str(args.alarm_p)}
    delays, mixed_runs, source = [], [], "served"
    for k in range(args.streams):
        warm = data["test"][rng.permutation(len(data["test"]))[: args.window]]
        mixed = data["test"][rng.integers(0, len(data["test"]), args.horizon)]
        ood = np.flatnonzero(rng.random(args.horizon) < args.ood_share)
        pick = rng.choice(OOD_SETS, len(ood))
        for i, name in zip(ood, pick, strict=True):
            mixed[i] = data[name][rng.integers(len(data[name]))]
        log = folder / f"mixed-{k}.log"
        with server(env, log) as base, contextlib.closing(Client(base, card)) as client:
            run = stream(
                client,
                np.concatenate([warm, mixed]),
                args.window,
                args.window,
                args.alarm_p,
                1,
                log,
            )
            source = client.drift
        # OOD images the server had seen when it alarmed (or in the whole horizon)
        run["ood_seen"] = int((ood < (run["first_alarm"] or args.horizon)).sum())
        mixed_runs.append(run)
        ok = run["first_alarm"] is not None and run["first_alarm"] > 0
        delays.append(run["first_alarm"] if ok else float("inf"))
    id_runs = []
    for k in range(args.id_streams):
        order = rng.permutation(len(data["test"]))
        images = data["test"][np.resize(order, args.id_requests)]
        log = folder / f"id-{k}.log"
        with server(env, log) as base, contextlib.closing(Client(base, card)) as client:
            run = stream(client, images, 0, args.window, args.alarm_p, args.scrape_every, log)
        id_runs.append(run)
    finite = sorted(delays)
    return {
        "source": source,
        "window": args.window,
        "alarm_p": args.alarm_p,
        "ood_share": args.ood_share,
        "warm_up": args.window,
        "horizon": args.horizon,
        "delay_median": float(np.median(finite)),
        "delay_p90": float(np.percentile(finite, 90)),
        "undetected": sum(d == float("inf") for d in delays),
        "delays": [None if d == float("inf") else d for d in delays],
        "mixed_streams": mixed_runs,
        "id_requests": args.id_requests,
        "id_streams": len(id_runs),
        "id_alarms": sum(r["first_alarm"] is not None or r["drift_log_lines"] > 0 for r in id_runs),
        "id_runs": id_runs,
    }


# --- cost ---------------------------------------------------------------------------------------


def without_score(folder: Path) -> Path:
    """The shipped file without the score in its graph (``export.typicality_graph``), as
    ``smso-export --no-typicality`` would write it: what "off" serves, so that neither the
    service nor onnxruntime computes a score there."""
    import onnx

    from export.typicality_graph import strip_score

    proto = onnx.load(MODEL)
    strip_score(proto)
    path = folder / "model-without-score.onnx"
    onnx.save(proto, path)
    return path


LOADS = ("/classify 1 PNG", "/v2 infer 64 FP32")


def measure_cost(card: Card, test: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    """Requests/s with typicality on (the shipped file) and off (``SMSO_TYPICALITY=false`` and
    the file without its score): ``--pairs`` pairs of fresh servers, ``--rounds`` interleaved
    rounds each; the ratio is the median of all rounds' ratios. With ``--control`` the same
    design runs off against off: what this machine reads as a cost where there is none."""
    files = [encode(x, "PNG") for x in test[:64]]
    body = binary_infer(card.preprocess(test[:64]), ("logits",))
    with tempfile.TemporaryDirectory(prefix="typicality-cost-") as folder:
        off = ({"SMSO_TYPICALITY": "false"}, without_score(Path(folder)))
        on = ({"SMSO_TYPICALITY": "true"}, MODEL)
        designs = {"typicality": (on, off)} | ({"control": (off, off)} if args.control else {})
        out = {name: _compare(a, b, card, files, body, args) for name, (a, b) in designs.items()}
    return {"pairs": args.pairs, "rounds": args.rounds, "clients": args.clients} | out


def _compare(
    a: tuple[dict[str, str], Path],
    b: tuple[dict[str, str], Path],
    card: Card,
    files: list[bytes],
    body: Body,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Setting ``a`` against ``b`` (environment, file): per load, requests/s and the server's
    CPU time per request of each, and the ratios a/b of requests/s and b/a of CPU time."""
    runs: dict[str, dict[str, list[float]]] = {load: {} for load in LOADS}
    pair_ratios: dict[str, list[float]] = {load: [] for load in LOADS}
    for pair in range(args.pairs):
        with contextlib.ExitStack() as stack:
            names = ["a", "b"] if pair % 2 == 0 else ["b", "a"]  # which starts first
            settings = {"a": a, "b": b}
            servers = {}
            for n in names:
                env, model = settings[n]
                env = env | {"SMSO_MAX_BATCH_SIZE": "64"}
                servers[n] = stack.enter_context(serve(env, model=model))
            sends = {
                n: {
                    LOADS[0]: multipart(f"{running.base}/classify", files),
                    LOADS[1]: post(f"{running.base}/v2/models/{card.name}/infer", [body]),
                }
                for n, running in servers.items()
            }
            for n in servers:  # warm-up
                for send in sends[n].values():
                    drive(send, args.clients, 20)
            ratios: dict[str, list[float]] = {load: [] for load in LOADS}
            for r in range(args.rounds):
                for load in LOADS:
                    rps = {}
                    for n in names if r % 2 == 0 else names[::-1]:
                        count = args.requests if load == LOADS[0] else args.requests // 8
                        before = group_cpu_seconds(servers[n].pid)  # its workers too
                        run = drive(sends[n][load], args.clients, count)
                        if run["failures"]:
                            raise RuntimeError(f"{run['failures']} failed requests ({load})")
                        cpu_ms = (group_cpu_seconds(servers[n].pid) - before) / count * 1e3
                        runs[load].setdefault(n, []).append(run["requests_per_second"])
                        runs[load].setdefault(f"{n}_cpu_ms", []).append(cpu_ms)
                        rps[n] = run["requests_per_second"]
                    ratios[load].append(rps["a"] / rps["b"])
            for load in LOADS:
                pair_ratios[load].append(statistics.median(ratios[load]))
    out: dict[str, dict[str, Any]] = {}
    for load, got in runs.items():
        per_round = [x / y for x, y in zip(got["a"], got["b"], strict=True)]
        cpu = [y / x for x, y in zip(got["a_cpu_ms"], got["b_cpu_ms"], strict=True)]
        out[load] = {
            "a_requests_per_second": statistics.median(got["a"]),
            "b_requests_per_second": statistics.median(got["b"]),
            "ratio": statistics.median(per_round),
            "round_ratios": per_round,
            "pair_ratios": pair_ratios[load],
            "a_server_cpu_ms_per_request": statistics.median(got["a_cpu_ms"]),
            "b_server_cpu_ms_per_request": statistics.median(got["b_cpu_ms"]),
            "cpu_ratio": statistics.median(cpu),
        }
    return out


# --- the run ------------------------------------------------------------------------------------


def load_data(args: argparse.Namespace) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    test, labels = fashion_mnist("test")
    data = {"val": validation_images(), "test": test, "test_labels": labels}
    data |= ood_sets(test, rng)
    if args.quick:  # a few hundred of each, drawn at random
        for k in ("val", "test", *OOD_SETS):
            pick = np.sort(rng.permutation(len(data[k]))[: args.set_size])
            data[k] = data[k][pick]
            if k == "test":
                data["test_labels"] = labels[pick]
    return data


def measure(args: argparse.Namespace) -> dict[str, Any]:
    card = Card.read(MODEL)
    data = load_data(args)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "separation.log"
        with server(log=log) as base, contextlib.closing(Client(base, card)) as client:
            result = {"source": client.source} | measure_separation(client, data, args.batch)
        drift = measure_drift(card, data, args, Path(tmp))
    cost = measure_cost(card, data["test"], args)
    ood_p = result.pop("ood_p_values")
    result.pop("test_p_values")
    result["ood_share_p_below_0.01"] = {s: float((v < ALPHA).mean()) for s, v in ood_p.items()}
    return {
        "machine": report.machine(),
        "quick": args.quick,
        "model": card.name,
        "separation": result,
        "drift": drift,
        "cost": cost,
        "targets": targets(result, drift, cost),
    }


def targets(
    separation: dict[str, Any], drift: dict[str, Any], cost: dict[str, Any]
) -> dict[str, bool]:
    """The typicality score's targets, each met or not."""
    mean = separation["mean_auroc"]
    worst = {s: min(METHODS, key=lambda m: separation["sets"][s][m]["auroc"]) for s in OOD_SETS}
    return {
        "beats_every_baseline_on_mean_auroc": all(
            mean["typicality"] > mean[m] for m in METHODS[1:]
        ),
        "never_worst_on_a_set": all(w != "typicality" for w in worst.values()),
        "mean_auroc_at_least_0.985": mean["typicality"] >= 0.985,
        "alarm_within_500_at_10%_ood": drift["undetected"] == 0
        and max(d for d in drift["delays"] if d is not None) <= 500,
        "no_alarm_in_id_streams": drift["id_alarms"] == 0,
        "cost_at_most_5%": cost["typicality"][LOADS[0]]["ratio"] >= 0.95,
    }


def table(result: dict[str, Any]) -> str:
    sep = result["separation"]
    rows = [
        "| OOD set | " + " | ".join(f"{m} AUROC (FPR95)" for m in METHODS) + " |",
        "|---|" + "--:|" * len(METHODS),
    ]
    for s in OOD_SETS:
        cells = [
            f"{sep['sets'][s][m]['auroc']:.3f} ({sep['sets'][s][m]['fpr_at_95_tpr']:.3f})"
            for m in METHODS
        ]
        rows.append(f"| {s} | " + " | ".join(cells) + " |")
    rows.append(
        "| **mean** | " + " | ".join(f"**{sep['mean_auroc'][m]:.3f}**" for m in METHODS) + " |"
    )
    d = result["drift"]
    rows.append(
        f"\nscore source: {sep['source']}; test accuracy {sep['test_accuracy']:.4f}; "
        f"test images with p < 0.01: {sep['test_share_p_below_0.01']:.4f}"
    )
    rows.append(
        f"drift ({d['source']}, W={d['window']}, alarm p < {d['alarm_p']:g}): "
        f"alarm after {d['delay_median']:.0f} mixed requests (median), p90 "
        f"{d['delay_p90']:.0f}, undetected {d['undetected']}/{len(d['delays'])}; "
        f"in-distribution: {d['id_alarms']} alarms in {d['id_streams']} streams of "
        f"{d['id_requests']:,} requests"
    )
    for design in ("typicality", "control"):
        for load, row in result["cost"].get(design, {}).items():
            pairs = ", ".join(f"{r:.3f}" for r in row["pair_ratios"])
            rows.append(
                f"cost ({'on/off' if design == 'typicality' else 'control: off/off'}), "
                f"{load}: {row['a_requests_per_second']:,.0f} / "
                f"{row['b_requests_per_second']:,.0f} req/s, ratio {row['ratio']:.3f} "
                f"(pairs {pairs}); server CPU per request "
                f"{row['a_server_cpu_ms_per_request']:.3f} / "
                f"{row['b_server_cpu_ms_per_request']:.3f} ms, ratio "
                f"{row['cpu_ratio']:.3f}"
            )
    rows.append(
        "targets: "
        + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in result["targets"].items())
    )
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--batch", type=int, default=64, help="images per infer request (separation)")
    add("--streams", type=int, default=10, help="drift streams at 10 %% OOD, each a server")
    add("--horizon", type=int, default=1500, help="mixed requests at most per drift stream")
    add("--ood-share", type=float, default=0.1, help="share of OOD images in a mixed stream")
    add("--id-streams", type=int, default=3, help="in-distribution streams (orders)")
    add("--id-requests", type=int, default=10_000, help="requests per in-distribution stream")
    add("--scrape-every", type=int, default=25, help="/metrics reads in the in-dist. streams")
    add("--window", type=int, default=200, help="SMSO_DRIFT_WINDOW of the drift servers")
    add("--alarm-p", type=float, default=1e-7, help="SMSO_DRIFT_ALARM_P of the drift servers")
    add("--pairs", type=int, default=8, help="cost: pairs of fresh servers (on and off)")
    add("--rounds", type=int, default=4, help="cost: interleaved rounds of on and off a pair")
    add(
        "--control",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="cost: also off against off, the same way (the measurement's own spread)",
    )
    add("--requests", type=int, default=800, help="cost: /classify requests a setting a round")
    add("--clients", type=int, default=4, help="cost: concurrent client threads")
    add("--quick", action="store_true", help="a seconds-long run with small sets (tests)")
    add("--set-size", type=int, default=256, help="--quick: images per set")
    add("--out", type=Path, default=RESULTS / "typicality.json", help="where to write the JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.streams, args.horizon, args.id_streams, args.id_requests = 1, 600, 1, 300
        args.pairs, args.rounds, args.requests, args.clients, args.control = 1, 1, 80, 2, False
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    result = measure(args)
    result["seconds"] = time.perf_counter() - start
    print(table(result), end="\n\n")
    report.save(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
