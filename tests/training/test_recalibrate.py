"""Sigma re-estimated after training: z' ~ N(0, 1) in eval mode, in smso-train and for a checkpoint.

The running average with the default ``momentum = 0.1`` leaves every output of ``z'`` a constant
offset; the cumulative average over the training images (``training.recalibrate``) removes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

import training.recalibrate as module
from export.graph import exportable
from training.checkpoint import held_val_accuracy, load_checkpoint, load_model
from training.evaluate import load_with_splits
from training.head_statistics import accumulate_input_statistics
from training.heads import SMSOPooling
from training.model import ModelConfig, build_model
from training.recalibrate import main as recalibrate_main
from training.recalibrate import recalibrate_checkpoint
from training.runtime import setup_runtime
from training.train import fit

from .test_train import tiny_config

C, P, H = 8, 24, 14
N = H * H


def gaussian_features(seed: int):
    """``draw(b)``: ``b`` images of ``x_i ~ N(0, Sigma)`` ``(b, C, H, H)``, and ``Sigma``."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(C, C, generator=gen, dtype=torch.float64)
    sigma = a @ a.T / C + 0.5 * torch.eye(C, dtype=torch.float64)  # non-diagonal, SPD
    chol = torch.linalg.cholesky(sigma).float()

    def draw(b: int) -> torch.Tensor:
        return (torch.randn(b, H, H, C, generator=gen) @ chol.T).permute(0, 3, 1, 2)

    return draw, sigma


@torch.no_grad()
def pre_affine(layer: SMSOPooling, draw, images: int) -> np.ndarray:
    """``z'`` in eval mode (before gamma and beta) of ``images`` fresh images, ``(images, P)``."""
    layer.eval()
    return np.concatenate(
        [layer.standardize(layer.vectorize(draw(2000)), N).numpy() for _ in range(images // 2000)]
    )


def ks_pvalues(z: np.ndarray, chunk: int = 5000) -> np.ndarray:
    """KS p-values against N(0, 1), per dimension and per chunk of ``chunk`` images.

    Chunks of 5,000: with more images KS starts to detect the square root's own small skewness
    (Wilson-Hilferty is an approximation), which Sigma cannot remove.
    """
    return np.array(
        [
            stats.kstest(z[start : start + chunk, j], "norm").pvalue
            for start in range(0, len(z), chunk)
            for j in range(z.shape[1])
        ]
    )


@pytest.fixture(scope="module")
def trained() -> tuple[SMSOPooling, torch.Tensor, object]:
    """An SMSO layer trained 100 steps with the default momentum on Gaussian features."""
    draw, sigma = gaussian_features(1234)
    torch.manual_seed(0)
    layer = SMSOPooling(C, P)
    assert layer.momentum == 0.1
    readout = nn.Linear(P, 4)
    optimizer = torch.optim.SGD([*layer.parameters(), *readout.parameters()], lr=0.05)
    for _ in range(100):
        labels = torch.randint(4, (64,))
        loss = nn.functional.cross_entropy(readout(layer(draw(64))), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return layer.eval(), sigma, draw


def test_recalibrated_sigma_makes_z_prime_standard_normal_per_dimension(trained) -> None:
    layer, sigma, draw = trained
    before = pre_affine(layer, draw, 100_000)
    images = accumulate_input_statistics(layer, (draw(2000) for _ in range(50)))
    assert images == 100_000
    err = (layer.running_cov.double() - sigma).abs().max() / sigma.abs().max()
    assert err < 2e-3
    after = pre_affine(layer, draw, 100_000)

    # the running average's offsets, which the test must be able to see
    assert np.abs(before.mean(0)).max() > 0.05
    assert (ks_pvalues(before) < 0.01).mean() > 0.2
    # after: every dimension centred and scaled, KS p-values not piled up below 0.01
    assert np.abs(after.mean(0)).max() < 0.02
    assert np.abs(after.std(0) - 1).max() < 0.05
    pvalues = ks_pvalues(after)  # 20 chunks x 24 dimensions
    assert (pvalues < 0.01).mean() < 0.03  # 0.01 expected
    assert stats.kstest(pvalues, "uniform").pvalue > 0.001  # p-values roughly uniform


def test_the_exporter_folds_the_recalibrated_sigma(trained) -> None:
    layer, _, draw = trained
    accumulate_input_statistics(layer, (draw(500) for _ in range(4)))
    w, sigma = layer.weight.detach().double(), layer.running_cov.double()
    folded = exportable_head(layer).inv_variance.double()
    torch.testing.assert_close(folded, 1 / ((w @ sigma) * w).sum(1), rtol=1e-5, atol=0)


def exportable_head(layer: SMSOPooling) -> nn.Module:
    """The folded head of an export module around ``layer``."""
    config = ModelConfig(
        3, backbone="small_cnn", head="smso", head_options={"dim": P}, reduce_dim=C
    )
    model = build_model(config)
    model.head.load_state_dict(layer.state_dict())
    return exportable(model).head


def test_input_statistics_need_an_image() -> None:
    with pytest.raises(ValueError, match="no images to estimate"):
        accumulate_input_statistics(SMSOPooling(C, P), [])


# --- smso-train and smso-recalibrate -----------------------------------------------------------


@pytest.fixture(scope="module")
def run(tiny_fashion_mnist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("recal") / "run"
    fit(tiny_config(tiny_fashion_mnist, out, epochs=1))
    return out


def test_smso_train_recalibrates_best_pt_over_the_training_images(run: Path) -> None:
    payload = load_checkpoint(run / "best.pt")
    report = payload["recalibration"]
    assert report["images"] == 160  # 200 training images less 40 held out for validation
    assert (report["split"], report["transform"]) == ("train", "eval")
    assert json.loads((run / "test.json").read_text())["recalibration"] == report
    assert "recalibration" not in load_checkpoint(run / "last.pt")  # kept for --resume as it was
    # the cumulative average over those images, recomputed here; best.pt holds it unless it
    # lowered the validation accuracy by more than its noise, else the running Sigma
    model, _ = load_model(run / "best.pt")
    _, _, splits = load_with_splits(run / "best.pt")
    train = splits.train_eval
    with torch.no_grad():
        features = [model.forward_features(train[i][0][None]) for i in range(len(train))]
    head = model.head
    assert isinstance(head, SMSOPooling)
    held = head.running_cov.clone()
    accumulate_input_statistics(head, features)
    if report["kept"]:
        torch.testing.assert_close(held, head.running_cov, rtol=1e-5, atol=1e-6)
    else:
        assert report["val_accuracy_after"] < report["val_accuracy_before"]
        running = load_checkpoint(run / "last.pt")["model_state"]["head.running_cov"]
        assert torch.equal(held, running)  # one epoch: best.pt is last.pt's weights
        assert not torch.allclose(held, head.running_cov)


def test_the_validation_accuracy_reported_is_that_of_what_best_pt_holds(run: Path) -> None:
    """After a re-estimate, the one measured with it if it was kept, else the one measured
    without it; the epoch's where there was none."""
    payload = load_checkpoint(run / "best.pt")
    report = payload["recalibration"]
    held = report["val_accuracy_after"] if report["kept"] else report["val_accuracy_before"]
    assert held_val_accuracy(payload) == held
    assert json.loads((run / "test.json").read_text())["val_accuracy"] == held
    kept = {**payload, "val_accuracy": 0.5, "recalibration": {**report, "kept": True}}
    assert held_val_accuracy(kept) == report["val_accuracy_after"]
    dropped = {**payload, "val_accuracy": 0.5, "recalibration": {**report, "kept": False}}
    assert held_val_accuracy(dropped) == report["val_accuracy_before"]
    assert held_val_accuracy({"val_accuracy": 0.5}) == 0.5


def test_the_summary_line_gives_every_epoch_and_the_accuracy_after_the_re_estimate() -> None:
    from training.train import RunResult

    report = {"kept": True, "val_accuracy_before": 0.3333, "val_accuracy_after": 0.6667}
    model = build_model(ModelConfig(3, "small_cnn", "smso", {"dim": 8}, reduce_dim=8))
    result = RunResult(Path("r"), 1, 0.3333, None, model, 2, 2, report)
    assert result.summary() == (
        "run: r  epochs: 2 of 2 (1 by this call)  best val: 0.3333 (0.6667 after Sigma's "
        "re-estimation)"
    )
    plain = RunResult(Path("r"), 2, 0.9, None, model, 2, 2, {**report, "kept": False})
    assert plain.summary() == "run: r  epochs: 2 of 2  best val: 0.9000"


def test_no_recalibrate_keeps_the_running_sigma(tiny_fashion_mnist: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    fit(tiny_config(tiny_fashion_mnist, out, epochs=1, recalibrate=False))
    best, last = load_checkpoint(out / "best.pt"), load_checkpoint(out / "last.pt")
    assert "recalibration" not in best
    assert torch.equal(
        best["model_state"]["head.running_cov"], last["model_state"]["head.running_cov"]
    )


def test_smso_recalibrate_writes_a_recalibrated_copy(run: Path, tmp_path: Path, capsys) -> None:
    source = tmp_path / "model.pt"
    payload = load_checkpoint(run / "best.pt")
    torch.save({k: v for k, v in payload.items() if k != "recalibration"}, source)
    before = source.read_bytes()
    copy = tmp_path / "recalibrated.pt"
    assert recalibrate_main([str(source), "-o", str(copy), "--workers", "0"]) == 0
    assert "Sigma from 160 training images" in capsys.readouterr().out
    assert source.read_bytes() == before  # the source is untouched
    written = load_checkpoint(copy)
    assert written["recalibration"]["images"] == 160
    assert written["train_config"] == payload["train_config"]
    torch.testing.assert_close(
        written["model_state"]["head.running_cov"], payload["model_state"]["head.running_cov"]
    )  # the same estimate smso-train made


def test_smso_recalibrate_refuses_a_head_without_sigma(
    tiny_fashion_mnist: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "gap"
    fit(tiny_config(tiny_fashion_mnist, out, epochs=1, head="gap", head_options={}))
    assert "recalibration" not in load_checkpoint(out / "best.pt")
    with pytest.raises(ValueError, match="has no statistics to re-estimate"):
        recalibrate_checkpoint(out / "best.pt", workers=0)
    assert recalibrate_main([str(out / "best.pt")]) == 2
    assert "smso-recalibrate: error:" in capsys.readouterr().err


def test_a_re_estimate_that_lowers_validation_accuracy_is_not_kept(monkeypatch) -> None:
    """The choice between the running and the re-estimated Sigma is made on validation images:
    on a small or easy dataset the running one can suit the trained weights better."""
    model = build_model(ModelConfig(3, "small_cnn", "smso", {"dim": 8}, reduce_dim=8))
    head = model.head
    assert isinstance(head, SMSOPooling)
    running = head.running_cov.clone()
    accuracies = iter([0.9, 0.5])  # before, after

    def evaluate(*args, **kwargs):
        return type("Result", (), {"accuracy": next(accuracies), "count": 10_000})()

    def fit_input_statistics(model, images, runtime):
        model.head.running_cov.mul_(1e6)  # a re-estimate that makes things worse
        return 10

    monkeypatch.setattr(module, "evaluate", evaluate)
    monkeypatch.setattr(module, "fit_input_statistics", fit_input_statistics)
    criterion = nn.functional.cross_entropy  # unused: evaluate is replaced
    report = module.recalibrate(model, [], [], criterion, 3, setup_runtime("cpu", "off"))
    assert report["kept"] is False
    assert (report["val_accuracy_before"], report["val_accuracy_after"]) == (0.9, 0.5)
    assert torch.equal(head.running_cov, running)
    accuracies = iter([0.5, 0.495])  # within 2 standard errors (0.01): the statistically right one
    assert module.recalibrate(model, [], [], criterion, 3, setup_runtime("cpu", "off"))["kept"]
    torch.testing.assert_close(head.running_cov, running * 1e6)


def test_a_running_sigma_with_nan_is_never_put_back(monkeypatch) -> None:
    """NaN outputs make any accuracy measured before the re-estimate meaningless."""
    model = build_model(ModelConfig(3, "small_cnn", "smso", {"dim": 8}, reduce_dim=8))
    head = model.head
    assert isinstance(head, SMSOPooling)
    head.running_cov.fill_(float("nan"))
    accuracies = iter([0.9, 0.5])  # before (NaN logits), after

    def evaluate(*args, **kwargs):
        return type("Result", (), {"accuracy": next(accuracies), "count": 10_000})()

    def fit_input_statistics(model, images, runtime):
        model.head.running_cov.copy_(torch.eye(model.head.running_cov.shape[0]))
        return 10

    monkeypatch.setattr(module, "evaluate", evaluate)
    monkeypatch.setattr(module, "fit_input_statistics", fit_input_statistics)
    criterion = nn.functional.cross_entropy  # unused: evaluate is replaced
    report = module.recalibrate(model, [], [], criterion, 3, setup_runtime("cpu", "off"))
    assert report["kept"] is True
    assert bool(torch.isfinite(head.running_cov).all())


# --- smso-recalibrate's output and smso-eval's refusal of NaN ------------------------------------


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("metrics.jsonl", b'{"epoch": 1, "val_accuracy": 0.9}\n'),
        ("model.onnx", b"\x08\x0a\x12\x0bsmso-export"),
        ("notes.txt", b"mine"),
    ],
)
def test_smso_recalibrate_never_writes_over_a_file_that_is_not_a_checkpoint(
    run: Path, tmp_path: Path, capsys, name: str, content: bytes
) -> None:
    other = tmp_path / name
    other.write_bytes(content)
    args = [str(run / "best.pt"), "-o", str(other), "--workers", "0"]
    assert recalibrate_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"smso-recalibrate: error: the output {other} exists and is not an SMSO checkpoint, "
        "which writing it would replace: give another file name such as recalibrated.pt (or "
        "remove the file)"
    )
    assert other.read_bytes() == content


def test_smso_recalibrate_writes_over_an_earlier_checkpoint(run: Path, tmp_path: Path) -> None:
    earlier = tmp_path / "recalibrated.pt"
    earlier.write_bytes((run / "last.pt").read_bytes())  # an SMSO checkpoint: replaceable
    assert recalibrate_main([str(run / "best.pt"), "-o", str(earlier), "--workers", "0"]) == 0
    assert load_checkpoint(earlier)["recalibration"]["images"] == 160


def test_smso_recalibrate_in_a_read_only_folder_is_refused_before_the_work(
    run: Path, tmp_path: Path, capsys, read_only
) -> None:
    folder = tmp_path / "shipped"
    folder.mkdir()
    checkpoint = folder / "best.pt"
    checkpoint.write_bytes((run / "best.pt").read_bytes())
    before = checkpoint.read_bytes()
    read_only(folder)
    assert recalibrate_main([str(checkpoint), "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"smso-recalibrate: error: the checkpoint {checkpoint} (in place) cannot be written: this "
        f"user cannot create files in the folder {folder} ("
    )
    assert "\n" not in err
    assert checkpoint.read_bytes() == before


def test_smso_eval_refuses_a_nan_sigma_and_smso_recalibrate_mends_it(
    run: Path, tmp_path: Path, capsys
) -> None:
    """Refused, as smso-export refuses it: NaN logits give an accuracy that measures nothing
    (every argmax lands on one class), and a warning would go unseen by a script reading
    --json. The message names the tensor and the tool that re-estimates it."""
    from training.evaluate import main as eval_main

    payload = load_checkpoint(run / "best.pt")
    payload["model_state"]["head.running_cov"].fill_(float("nan"))
    broken = tmp_path / "broken.pt"
    torch.save(payload, broken)
    report = tmp_path / "eval.json"
    args = ["--split", "val", "--workers", "0"]
    assert eval_main([str(broken), *args, "--json", str(report)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"smso-eval: error: {broken} holds NaN or infinite values in head.running_cov (64 of 64): "
        "the model's outputs would be NaN; the head re-estimates them from the training images: "
        f"run smso-recalibrate {broken}"
    )
    assert not report.exists()
    assert recalibrate_main([str(broken), "--workers", "0"]) == 0
    assert eval_main([str(broken), *args]) == 0
