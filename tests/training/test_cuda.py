"""The CUDA paths: mixed precision with the head in float32, channels-last, a run on the GPU.

Skipped where no GPU is present (CI); run on a GPU with ``pytest -m cuda``.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from training.checkpoint import load_model
from training.heads.smso import SMSOPooling
from training.model import ModelConfig, build_model
from training.train import fit

from .test_train import tiny_config

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("amp", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", ["conv", "covariance"])
def test_smso_under_autocast_computes_in_float32_and_matches_the_cpu(amp, form):
    torch.manual_seed(0)
    pool = SMSOPooling(64, 16, form=form).eval()
    x = torch.randn(4, 64, 7, 7)
    # the backbone hands over a low-precision map: the reference sees the same rounded input
    reference = pool(x.to(amp).float())
    gpu = copy.deepcopy(pool).cuda()
    with torch.autocast("cuda", dtype=amp):
        out = gpu(x.cuda().to(amp))
    assert out.dtype == torch.float32
    # float32 on the GPU may use TF32 in cuDNN's convolutions: about 1e-3 relative
    torch.testing.assert_close(out.cpu(), reference, rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("amp", [torch.bfloat16, torch.float16])
def test_a_mixed_precision_channels_last_training_step_is_finite(amp):
    torch.manual_seed(0)
    config = ModelConfig(
        num_classes=10, backbone="resnet18", head="smso", reduce_dim=64, head_options={"dim": 32}
    )
    model = build_model(config).cuda().to(memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=amp == torch.float16)
    images = torch.randn(8, 3, 64, 64, device="cuda").contiguous(memory_format=torch.channels_last)
    labels = torch.randint(10, (8,), device="cuda")
    for _ in range(3):
        with torch.autocast("cuda", dtype=amp):
            logits, embedding = model(images)
        assert embedding.dtype == torch.float32
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        assert torch.isfinite(loss)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_a_gpu_run_trains_and_its_checkpoint_loads_on_the_cpu(tiny_fashion_mnist, tmp_path, amp):
    out = tmp_path / "run"
    cfg = tiny_config(tiny_fashion_mnist, out, device="cuda", amp=amp, channels_last=True, epochs=3)
    result = fit(cfg)
    assert result.test is not None
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(line["train_loss"] == line["train_loss"] for line in lines)  # no NaN
    model, _ = load_model(out / "best.pt")  # written on the GPU, read on the CPU
    assert next(model.parameters()).device.type == "cpu"
